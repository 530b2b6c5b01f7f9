//! Fencing for resources reached over HTTP (cargo feature `http`).
//!
//! A caller sends its lock's token with every write, as the `Lockd-Fencing-Token` header
//! ([`TOKEN_HEADER`], [`token_header`]). A Rust service in front of the resource wraps its
//! routes in [`FenceLayer`] (tower; axum and tonic routers take it): per resource it keeps the
//! largest token admitted so far, refuses an older one with `409 Conflict`, and runs requests
//! of one resource one at a time, so that the check and the write cannot be overtaken by a newer
//! holder's write in between. The resource is chosen by a function of the request (the path, a
//! header such as [`RESOURCE_HEADER`], a tenant id).
//!
//! ```no_run
//! # fn demo<S>(svc: S) {
//! use lockd_client::fence::http::{by_header, FenceLayer, Fences};
//! use tower::Layer;
//! let fences = Fences::default();
//! // The request body type of the service (axum's `Body`, a `String`, ...).
//! let fenced = FenceLayer::new(fences, by_header::<String>).layer(svc);
//! # }
//! ```
//!
//! The fences live in memory: a restarted service starts with none, so the first write after a
//! restart is admitted whatever its token. Where that matters, keep the fence in the resource's
//! own storage (`fence::postgres`), which survives restarts.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};

use crate::LockGuard;

/// The header carrying a write's fencing token (decimal).
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("lockd-fencing-token");
/// A header naming the resource a write is fenced on, for [`by_header`].
pub const RESOURCE_HEADER: HeaderName = HeaderName::from_static("lockd-fencing-resource");

/// The `Lockd-Fencing-Token` header for a write made under `guard`.
pub fn token_header(guard: &LockGuard) -> (HeaderName, HeaderValue) {
    (TOKEN_HEADER, HeaderValue::from(guard.token()))
}

/// The resource named by the `Lockd-Fencing-Resource` header, else the request's path.
pub fn by_header<B>(req: &Request<B>) -> String {
    req.headers()
        .get(&RESOURCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| req.uri().path().to_string(), str::to_string)
}

/// The largest token admitted per resource, shared by every clone of a [`FenceLayer`].
#[derive(Clone, Default)]
pub struct Fences {
    inner: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<u64>>>>>,
}

impl Fences {
    /// The largest token admitted for `resource` (0 if none).
    pub async fn current(&self, resource: &str) -> u64 {
        *self.slot(resource).lock().await
    }

    fn slot(&self, resource: &str) -> Arc<tokio::sync::Mutex<u64>> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(resource.to_string())
            .or_default()
            .clone()
    }
}

/// Wraps a service so that every request carries a fencing token no older than its resource's.
#[derive(Clone)]
pub struct FenceLayer<R> {
    fences: Fences,
    resource: R,
}

impl<R> FenceLayer<R> {
    /// Fences requests on `resource(request)`, remembering tokens in `fences`.
    pub fn new(fences: Fences, resource: R) -> Self {
        FenceLayer { fences, resource }
    }
}

impl<S, R: Clone> tower::Layer<S> for FenceLayer<R> {
    type Service = Fenced<S, R>;

    fn layer(&self, inner: S) -> Fenced<S, R> {
        Fenced {
            inner,
            fences: self.fences.clone(),
            resource: self.resource.clone(),
        }
    }
}

/// The service [`FenceLayer`] makes.
#[derive(Clone)]
pub struct Fenced<S, R> {
    inner: S,
    fences: Fences,
    resource: R,
}

fn refuse<B: From<String>>(status: StatusCode, msg: String) -> Response<B> {
    let mut r = Response::new(B::from(msg));
    *r.status_mut() = status;
    r
}

impl<S, R, ReqBody, ResBody> tower::Service<Request<ReqBody>> for Fenced<S, R>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    R: Fn(&Request<ReqBody>) -> String,
    ReqBody: Send + 'static,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request (tower's usual dance).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let resource = (self.resource)(&req);
        let token = match req.headers().get(&TOKEN_HEADER).map(|v| v.to_str()) {
            None => {
                let msg = format!("a write to '{resource}' needs a {TOKEN_HEADER} header");
                return Box::pin(async move { Ok(refuse(StatusCode::PRECONDITION_REQUIRED, msg)) });
            }
            Some(v) => match v.ok().and_then(|s| s.parse::<u64>().ok()) {
                Some(t) => t,
                None => {
                    let msg = format!("{TOKEN_HEADER} must be a decimal u64");
                    return Box::pin(async move { Ok(refuse(StatusCode::BAD_REQUEST, msg)) });
                }
            },
        };
        let slot = self.fences.slot(&resource);
        Box::pin(async move {
            // Held until the inner service has answered: no newer write can slip in between
            // this check and the write it admits.
            let mut fence = slot.lock().await;
            if token < *fence {
                let msg = format!(
                    "fencing token {token} is older than {} for '{resource}': a newer holder \
                     has written; stop",
                    *fence
                );
                return Ok(refuse(StatusCode::CONFLICT, msg));
            }
            *fence = token;
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use tower::{Layer, Service, ServiceExt};

    use super::*;

    fn req(resource: &str, token: Option<&str>) -> Request<String> {
        let mut b = Request::builder()
            .uri("/accounts/1")
            .header(RESOURCE_HEADER, resource);
        if let Some(t) = token {
            b = b.header(TOKEN_HEADER, t);
        }
        b.body(String::new()).unwrap()
    }

    /// The resource behind the fence: a log of the writes it applied; a write with token 5
    /// takes `delay` (an old holder's slow write), the others none.
    fn store(
        log: Arc<Mutex<Vec<String>>>,
        delay: Duration,
    ) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
           + Clone
           + Send
           + 'static {
        tower::service_fn(move |r: Request<String>| {
            let log = log.clone();
            async move {
                let t = r.headers()[&TOKEN_HEADER].to_str().unwrap().to_string();
                if t == "5" {
                    tokio::time::sleep(delay).await;
                }
                log.lock().unwrap().push(t);
                Ok::<_, Infallible>(Response::new("written".to_string()))
            }
        })
    }

    #[tokio::test]
    async fn older_tokens_are_refused_per_resource_and_equal_ones_pass() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let fences = Fences::default();
        let svc = FenceLayer::new(fences.clone(), by_header::<String>)
            .layer(store(log.clone(), Duration::ZERO));
        let status = |r| {
            let svc = svc.clone();
            async move { svc.oneshot(r).await.unwrap().status() }
        };
        assert_eq!(status(req("a", Some("5"))).await, StatusCode::OK);
        assert_eq!(status(req("a", Some("5"))).await, StatusCode::OK);
        assert_eq!(status(req("a", Some("7"))).await, StatusCode::OK);
        assert_eq!(status(req("a", Some("6"))).await, StatusCode::CONFLICT);
        assert_eq!(
            status(req("b", Some("1"))).await,
            StatusCode::OK,
            "another resource"
        );
        assert_eq!(
            status(req("a", None)).await,
            StatusCode::PRECONDITION_REQUIRED
        );
        assert_eq!(status(req("a", Some("-1"))).await, StatusCode::BAD_REQUEST);
        assert_eq!(*log.lock().unwrap(), ["5", "5", "7", "1"]);
        assert_eq!(fences.current("a").await, 7);
    }

    #[tokio::test]
    async fn a_newer_write_waits_for_an_older_one_in_flight_and_the_older_cannot_follow() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let svc = FenceLayer::new(Fences::default(), by_header::<String>)
            .layer(store(log.clone(), Duration::from_millis(200)));
        let older = tokio::spawn(svc.clone().oneshot(req("a", Some("5"))));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let newer = tokio::spawn(svc.clone().oneshot(req("a", Some("6"))));
        assert_eq!(older.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(newer.await.unwrap().unwrap().status(), StatusCode::OK);
        let late = svc.clone().oneshot(req("a", Some("5"))).await.unwrap();
        assert_eq!(late.status(), StatusCode::CONFLICT);
        assert!(late.body().contains("older than 6"), "{}", late.body());
        // Without the per-resource turn the newer write would land first and the older one
        // on top of it.
        assert_eq!(*log.lock().unwrap(), ["5", "6"], "applied in token order");
    }
}
