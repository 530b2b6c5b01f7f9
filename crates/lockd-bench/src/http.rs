//! A lean HTTP/1.1 JSON client: one keep-alive connection per benchmark client.
//!
//! Why not reqwest or a pooled client: each benchmark client owns exactly one connection, like
//! a worker process would, so there is no pool to contend on and no TLS stack to build. Used for
//! etcd's grpc-gateway (JSON over HTTP/1.1) and, once its API lands, for lockd's HTTP API.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One keep-alive HTTP/1.1 connection to one server, reopened after an error.
pub struct HttpConn {
    addr: SocketAddr,
    host: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl HttpConn {
    /// Connects now, so that connection errors show up before a measurement starts.
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let mut conn = HttpConn {
            addr,
            host: addr.to_string(),
            sender: None,
        };
        conn.sender = Some(conn.open().await?);
        Ok(conn)
    }

    async fn open(&self) -> Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connect {}", self.addr))?;
        stream.set_nodelay(true)?;
        // The connection task ends when `sender` is dropped or the server closes.
        if let Some(tls) = crate::tls::of(self.addr) {
            let name = rustls::pki_types::ServerName::from(self.addr.ip());
            let stream = tokio_rustls::TlsConnector::from(tls.rustls)
                .connect(name, stream)
                .await
                .with_context(|| format!("TLS to {}", self.addr))?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            return Ok(sender);
        }
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Sends one request and reads the whole reply. A failed connection is dropped and
    /// reopened on the next call (the failed request is not retried: it may have been applied).
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes)> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.open().await?,
        };
        sender.ready().await.context("connection not ready")?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.host);
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await.context("send request")?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("read body")?
            .to_bytes();
        self.sender = Some(sender);
        Ok((status, bytes))
    }

    /// POSTs `body` as JSON and returns the 200 reply's bytes; any other status is an error.
    pub async fn post_json(&mut self, path: &str, body: &serde_json::Value) -> Result<Bytes> {
        let (status, bytes) = self
            .request(Method::POST, path, Some(serde_json::to_vec(body)?))
            .await?;
        if status != StatusCode::OK {
            bail!("POST {path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(bytes)
    }
}
