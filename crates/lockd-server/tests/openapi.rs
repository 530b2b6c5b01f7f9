//! docs/openapi.yaml and the server stay in step: the spec lists exactly the endpoints the server
//! declares, and the server answers every one of them (not with its "no such endpoint" fallback).

mod common;

use std::collections::BTreeSet;

use common::*;
use lockd_server::http::ENDPOINTS;
use serde_json::json;

/// (method, path) pairs from the spec's `paths:` section (two-space path keys, four-space methods).
fn spec_endpoints() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let mut out = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for line in text.lines() {
        if line == "paths:" {
            in_paths = true;
            continue;
        }
        if in_paths && !line.starts_with(' ') && !line.is_empty() {
            break;
        }
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            path = Some(format!("/{p}"));
        } else if let Some(m) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')) {
            if ["get", "post", "delete", "put", "patch"].contains(&m) {
                out.insert((m.to_string(), path.clone().expect("a method under a path")));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_and_the_server_list_the_same_endpoints() {
    let declared: BTreeSet<_> = ENDPOINTS
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(spec_endpoints(), declared);

    let mut c = cluster(1, 1).await;
    let h = Http::new(c.url(0, ""));
    let s = h.session("spec", 15).await;
    for (method, path) in ENDPOINTS {
        let path = path.replace("{id}", &s).replace("{name}", "spec-lock");
        let r = match *method {
            "get" => h.get(&path).await,
            "delete" => h.delete(&path).await,
            _ => h.post(&path, json!({})).await,
        };
        let fallback = r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("no such endpoint"));
        assert!(
            !fallback && r.status != 405,
            "{method} {path} is not served: {} {}",
            r.status,
            r.body
        );
    }
    c.stop_all().await;
}

/// The spec's error code enum is the proto's `ErrorCode`, name for name.
#[test]
fn the_spec_lists_every_error_code() {
    use lockd_server::error::{Code, ErrorCode};
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let start = text
        .find("                    enum:\n")
        .expect("the code enum");
    let spec: BTreeSet<String> = text[start..]
        .lines()
        .skip(1)
        .map_while(|l| l.strip_prefix("                      - "))
        .map(str::to_string)
        .collect();
    let proto: BTreeSet<String> = (1..=255)
        .filter_map(|i| ErrorCode::try_from(i).ok())
        .map(|c| c.name().to_string())
        .collect();
    assert_eq!(spec, proto);
}

/// Every operation has a unique `operationId` and tags; every one that takes a body lists 415
/// (and 400, 413); every admin operation needs the bearer scheme.
#[test]
fn every_operation_is_named_tagged_and_lists_its_statuses() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let paths = &text[text.find("\npaths:\n").unwrap()..text.find("\ncomponents:\n").unwrap()];
    let mut ops: Vec<(String, Vec<&str>)> = Vec::new();
    let mut path = String::new();
    for line in paths.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            path = format!("/{p}");
        } else if let Some(m) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')) {
            if ["get", "post", "delete"].contains(&m) {
                ops.push((format!("{m} {path}"), Vec::new()));
            }
        } else if line.starts_with("      ") {
            if let Some((_, body)) = ops.last_mut() {
                body.push(line.trim());
            }
        }
    }
    assert_eq!(ops.len(), ENDPOINTS.len());
    let mut ids = BTreeSet::new();
    for (op, body) in &ops {
        let id = body
            .iter()
            .find_map(|l| l.strip_prefix("operationId: "))
            .unwrap_or_else(|| panic!("{op}: no operationId"));
        assert!(ids.insert(id.to_string()), "{op}: operationId {id} twice");
        assert!(
            body.iter().any(|l| l.starts_with("tags: [")),
            "{op}: no tags"
        );
        if body.iter().any(|l| l.starts_with("requestBody:")) {
            for status in ["\"400\":", "\"413\":", "\"415\":"] {
                assert!(
                    body.iter().any(|l| l.starts_with(status)),
                    "{op}: takes a body but does not list {status}"
                );
            }
        }
        if op.contains("/v1/admin/") {
            assert!(
                body.contains(&"security: [{bearer: []}]"),
                "{op}: an admin call without the bearer scheme"
            );
        }
    }
}

/// The spec's `Name` pattern and the server's name rule (`limits::check_new_name`) accept the
/// same characters: every Unicode scalar value is tried as a one-character name against both.
#[test]
fn the_name_pattern_is_the_servers_rule() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let after = text
        .split_once("\n    Name:\n      type: string\n")
        .expect("the Name schema")
        .1;
    let quoted = after
        .lines()
        .find_map(|l| l.trim().strip_prefix("pattern: \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("a double-quoted pattern");
    // The YAML escapes the pattern uses: `\\` and `\UXXXXXXXX`.
    let (mut pattern, mut rest) = (String::new(), quoted);
    while let Some(i) = rest.find('\\') {
        pattern.push_str(&rest[..i]);
        let esc = &rest[i + 1..];
        if let Some(r) = esc.strip_prefix('\\') {
            pattern.push('\\');
            rest = r;
        } else if let Some(r) = esc.strip_prefix('U') {
            let c = u32::from_str_radix(&r[..8], 16).unwrap();
            pattern.push(char::from_u32(c).unwrap());
            rest = &r[8..];
        } else {
            panic!("an unexpected YAML escape in {quoted}");
        }
    }
    pattern.push_str(rest);
    let re = regex::Regex::new(&pattern).unwrap();
    let mut differ = Vec::new();
    for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
        let name = c.to_string();
        let spec = re.is_match(&name);
        let server = lockd_core::limits::check_new_name(&name).is_ok();
        if spec != server {
            differ.push(format!("U+{:04X} spec={spec} server={server}", c as u32));
        }
    }
    assert!(
        differ.is_empty(),
        "{} differ: {:?}",
        differ.len(),
        &differ[..differ.len().min(20)]
    );
}
