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

/// The spec's `Name` patterns (`pattern`, and `not: {pattern}` for the astral characters) and
/// the server's name rule (`limits::check_new_name`) accept the same characters: every Unicode
/// scalar value is tried as a one-character name against both.
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
    let mut quoted = after
        .lines()
        .take_while(|l| !l.trim_start().starts_with("description:"))
        .filter_map(|l| l.trim().strip_prefix("pattern: \""))
        .map(|l| l.strip_suffix('"').expect("a double-quoted pattern"));
    let (allowed, refused) = (
        yaml_unescape(quoted.next().expect("Name's pattern")),
        yaml_unescape(quoted.next().expect("Name's not: {pattern}")),
    );
    let (allowed, refused) = (
        regex::Regex::new(&allowed).unwrap(),
        regex::Regex::new(&refused).unwrap(),
    );
    let mut differ = Vec::new();
    for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
        let name = c.to_string();
        let spec = allowed.is_match(&name) && !refused.is_match(&name);
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

/// The YAML double-quoted escapes the Name patterns use: `\\` and `\UXXXXXXXX`.
fn yaml_unescape(quoted: &str) -> String {
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
    pattern
}

/// The single-quoted `pattern` on the line after `line_start` (or on it) in docs/openapi.yaml.
fn spec_pattern_after(text: &str, line_start: &str) -> regex::Regex {
    let rest = &text[text.find(line_start).expect(line_start)..];
    let p = rest
        .split_once("pattern: '")
        .expect("a single-quoted pattern")
        .1
        .split_once('\'')
        .unwrap()
        .0;
    regex::Regex::new(p).unwrap()
}

/// The admin fields whose grammar the spec states as a pattern (peer addresses, bucket sets,
/// group lists) accept what the server's parsers accept, on a corpus of good and bad inputs:
/// schemathesis (scripts/test-contract) generates from these patterns and expects the server
/// to agree both ways.
#[test]
fn the_admin_patterns_are_the_servers_parsers() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let peer = spec_pattern_after(&text, "                peer_addr:\n");
    for a in [
        "10.0.0.1:7270",
        "255.255.255.255:65535",
        "0.0.0.0:1",
        "[::1]:7270",
        "[::]:1",
        "[fe80::1:2]:80",
        "[1:2:3:4:5:6:7:8]:80",
        "[::ffff:10.0.0.1]:80",
        "[1:2:3:4:5:6:1.2.3.4]:80",
        "localhost:7270",
        "lockd-0.lockd.prod.svc.cluster.local:7270",
        "node-2.:1",
        "a.b-c.d9:9",
        "x1:65535",
        "10.0.0.1",
        "10.0.0.1:0",
        "10.0.0.1:07270",
        "10.0.0.1:65536",
        "host:+1",
        "01.2.3.4:80",
        "300.1.1.1:7270",
        "a.123:80",
        "1.2.3:80",
        "-host:1",
        "host-:1",
        "ho_st:1",
        "a..b:1",
        ".a:1",
        "[::1:80",
        "[1:2:3:4:5:6:7:8:9]:80",
        "[:::]:80",
        "[12345::]:80",
        ":80",
        "",
    ] {
        let spec = peer.is_match(a);
        let server = lockd_raft::check_peer_addr(a).is_ok();
        assert_eq!(
            spec, server,
            "peer_addr {a:?}: spec {spec}, server {server}"
        );
    }
    let buckets = spec_pattern_after(&text, "                buckets:\n");
    for b in [
        "0",
        "4095",
        "0-63",
        "63-0",
        "0-63,100",
        " 0 - 63 , 100 ",
        "4095, 0-2,7",
        "1,1,1",
        "",
        "4096",
        "01",
        "+1",
        "-1",
        "1-",
        "1-2-3",
        "1,,2",
        "a",
        "1\t",
        "0x10",
    ] {
        let spec = buckets.is_match(b);
        let server = b.parse::<lockd_core::BucketSet>().is_ok();
        assert_eq!(spec, server, "buckets {b:?}: spec {spec}, server {server}");
    }
    let groups = spec_pattern_after(&text, "- {name: groups, in: query");
    for (g, ok) in [
        ("", true),
        ("0", true),
        ("1,2,3", true),
        ("4294967295", true),
        ("4294967296", false),
        ("01", false),
        ("1,", false),
        (" 1", false),
        ("+1", false),
        ("1,,2", false),
    ] {
        assert_eq!(groups.is_match(g), ok, "groups {g:?}");
    }
}
