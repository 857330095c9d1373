//! The bootstrap (gRFC A27): where the management server is and who this
//! client is, as JSON:
//!
//! ```json
//! {
//!   "xds_servers": [{"server_uri": "127.0.0.1:18000",
//!                    "channel_creds": [{"type": "insecure"}],
//!                    "server_features": ["xds_v3"]}],
//!   "node": {"id": "client-1", "cluster": "front", "locality": {"zone": "a"}}
//! }
//! ```
//!
//! Read from the file `GRPC_XDS_BOOTSTRAP` names or from
//! `GRPC_XDS_BOOTSTRAP_CONFIG` itself. The first server is used, with the
//! first of its `channel_creds` this client supports, as gRPC picks them:
//! `insecure`, or `tls` (gRFC A65) with `config` naming PEM files —
//! `ca_certificate_file` (the roots the server's certificate must chain
//! to: required here, as this client does not read the system's store),
//! and `certificate_file` with `private_key_file` for mutual TLS. The files
//! are read when the bootstrap is; `refresh_interval` is not followed.
//! A bootstrap whose servers offer only credentials this client does not
//! support is refused, never silently downgraded. Unknown fields are
//! ignored.

use protoplane_grpc::status::{Code, Status};
use serde_json::Value;

/// A parsed bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The management server (`host:port`, or any protoplane target).
    pub server_uri: String,
    /// `ignore_resource_deletion` among the server's features: a listener
    /// or cluster missing from a response is kept, not dropped.
    pub ignore_resource_deletion: bool,
    pub node_id: String,
    pub node_cluster: String,
    /// TLS to the management server (`tls` credentials), or plaintext.
    pub tls: Option<Tls>,
    /// (region, zone, sub_zone).
    pub locality: (String, String, String),
}

/// `tls` channel credentials, their files read.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
    /// PEM roots (`ca_certificate_file`).
    pub roots_pem: Vec<u8>,
    /// PEM certificate chain and key (`certificate_file`,
    /// `private_key_file`), for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls").field("mutual", &self.identity.is_some()).finish_non_exhaustive()
    }
}

/// `tls` credentials' `config` (gRFC A65).
fn tls_config(config: Option<&Value>) -> Result<Tls, Status> {
    let at = "xds_servers[0].channel_creds tls config";
    let file = |field: &str| -> Result<Option<Vec<u8>>, Status> {
        let name = text(config.and_then(|c| c.get(field)), &format!("{at}.{field}"))?;
        if name.is_empty() {
            return Ok(None);
        }
        std::fs::read(&name).map(Some).map_err(|e| bad(format!("{at}.{field} {name:?}: {e}")))
    };
    let roots_pem = file("ca_certificate_file")?.ok_or_else(|| {
        bad(format!("{at}: ca_certificate_file is required (the system's roots are not read)"))
    })?;
    let identity = match (file("certificate_file")?, file("private_key_file")?) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(bad(format!("{at}: certificate_file and private_key_file go together"))),
    };
    Ok(Tls { roots_pem, identity })
}

fn bad(why: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, format!("xDS bootstrap: {why}"))
}

fn text(v: Option<&Value>, field: &str) -> Result<String, Status> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(bad(format!("{field} is not a string"))),
    }
}

impl Bootstrap {
    /// Parses bootstrap JSON.
    pub fn from_json(json: &str) -> Result<Bootstrap, Status> {
        let v: Value = serde_json::from_str(json).map_err(bad)?;
        let servers = v
            .get("xds_servers")
            .and_then(Value::as_array)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("xds_servers: a list of at least one server is required"))?;
        let server = &servers[0];
        let server_uri = text(server.get("server_uri"), "xds_servers[0].server_uri")?;
        if server_uri.is_empty() {
            return Err(bad("xds_servers[0].server_uri is required"));
        }
        let creds =
            server.get("channel_creds").and_then(Value::as_array).cloned().unwrap_or_default();
        let kinds: Vec<String> = creds
            .iter()
            .filter_map(|c| c.get("type").and_then(Value::as_str).map(str::to_string))
            .collect();
        // The first credentials this client supports, in the listed order.
        let chosen = creds.iter().find(|c| {
            matches!(c.get("type").and_then(Value::as_str), Some("insecure") | Some("tls"))
        });
        let tls = match chosen {
            None => {
                return Err(bad(format!(
                    "xds_servers[0].channel_creds {kinds:?}: none is supported \
                     (\"insecure\" and \"tls\" are)"
                )))
            }
            Some(c) if c.get("type").and_then(Value::as_str) == Some("tls") => {
                Some(tls_config(c.get("config"))?)
            }
            Some(_) => None,
        };
        let features: Vec<&str> = server
            .get("server_features")
            .and_then(Value::as_array)
            .map(|f| f.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let node = v.get("node").cloned().unwrap_or(Value::Null);
        let loc = node.get("locality").cloned().unwrap_or(Value::Null);
        Ok(Bootstrap {
            server_uri,
            ignore_resource_deletion: features.contains(&"ignore_resource_deletion"),
            tls,
            node_id: text(node.get("id"), "node.id")?,
            node_cluster: text(node.get("cluster"), "node.cluster")?,
            locality: (
                text(loc.get("region"), "node.locality.region")?,
                text(loc.get("zone"), "node.locality.zone")?,
                text(loc.get("sub_zone"), "node.locality.sub_zone")?,
            ),
        })
    }

    /// The bootstrap of this process: `GRPC_XDS_BOOTSTRAP` (a file) or
    /// `GRPC_XDS_BOOTSTRAP_CONFIG` (the JSON).
    pub fn from_env() -> Result<Bootstrap, Status> {
        if let Some(path) = std::env::var_os("GRPC_XDS_BOOTSTRAP") {
            let p = std::path::PathBuf::from(path);
            let json = std::fs::read_to_string(&p)
                .map_err(|e| bad(format!("GRPC_XDS_BOOTSTRAP={}: {e}", p.display())))?;
            return Bootstrap::from_json(&json);
        }
        if let Ok(json) = std::env::var("GRPC_XDS_BOOTSTRAP_CONFIG") {
            return Bootstrap::from_json(&json);
        }
        Err(bad("neither GRPC_XDS_BOOTSTRAP nor GRPC_XDS_BOOTSTRAP_CONFIG is set"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first supported credentials win, and `tls` reads its files.
    #[test]
    fn tls_credentials_read_their_files_in_the_listed_order() {
        let dir = std::env::temp_dir().join(format!("pp-xds-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (ca, cert, key) = (dir.join("ca.pem"), dir.join("c.pem"), dir.join("k.pem"));
        for (p, body) in [(&ca, "roots"), (&cert, "chain"), (&key, "key")] {
            std::fs::write(p, body).expect("write");
        }
        let tls = format!(
            r#"{{"type": "tls", "config": {{"ca_certificate_file": {:?},
                 "certificate_file": {:?}, "private_key_file": {:?}}}}}"#,
            ca.display().to_string(),
            cert.display().to_string(),
            key.display().to_string()
        );
        let boot = |creds: &str| {
            Bootstrap::from_json(&format!(
                r#"{{"xds_servers": [{{"server_uri": "127.0.0.1:1", "channel_creds": [{creds}]}}]}}"#
            ))
        };
        let b = boot(&format!(r#"{{"type": "google_default"}}, {tls}, {{"type": "insecure"}}"#))
            .expect("tls");
        let t = b.tls.expect("tls chosen");
        assert_eq!(t.roots_pem, b"roots");
        assert_eq!(t.identity, Some((b"chain".to_vec(), b"key".to_vec())));
        assert!(!format!("{t:?}").contains("key"), "the key stays out of Debug");
        let b = boot(&format!(r#"{{"type": "insecure"}}, {tls}"#)).expect("insecure");
        assert!(b.tls.is_none(), "insecure listed first");
        let half = format!(
            r#"{{"type": "tls", "config": {{"ca_certificate_file": {:?}, "certificate_file": {:?}}}}}"#,
            ca.display().to_string(),
            cert.display().to_string()
        );
        let e = boot(&half).expect_err("a certificate without its key");
        assert!(e.message.contains("go together"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bootstrap_parses_and_bad_ones_say_why() {
        let b = Bootstrap::from_json(
            r#"{"xds_servers": [{"server_uri": "127.0.0.1:18000",
                 "channel_creds": [{"type": "google_default"}, {"type": "insecure"}],
                 "server_features": ["xds_v3", "ignore_resource_deletion"]}],
                "node": {"id": "n1", "cluster": "c", "locality": {"zone": "a"}, "other": 1}}"#,
        )
        .expect("parses");
        assert_eq!(b.server_uri, "127.0.0.1:18000");
        assert!(b.ignore_resource_deletion);
        assert_eq!((b.node_id.as_str(), b.locality.1.as_str()), ("n1", "a"));
        for (json, why) in [
            (r#"{}"#, "xds_servers"),
            (r#"{"xds_servers": [{"channel_creds": [{"type": "insecure"}]}]}"#, "server_uri"),
            (
                r#"{"xds_servers": [{"server_uri": "x:1", "channel_creds": [{"type": "google_default"}]}]}"#,
                "none is supported",
            ),
            (
                r#"{"xds_servers": [{"server_uri": "x:1", "channel_creds": [{"type": "tls"}]}]}"#,
                "ca_certificate_file is required",
            ),
            (
                r#"{"xds_servers": [{"server_uri": "x:1", "channel_creds": [{"type": "tls",
                     "config": {"ca_certificate_file": "/nonexistent/ca.pem"}}]}]}"#,
                "/nonexistent/ca.pem",
            ),
            (r#"{"xds_servers": [{"server_uri": 5}]}"#, "not a string"),
            ("not json", "bootstrap"),
        ] {
            let e = Bootstrap::from_json(json).expect_err(json);
            assert!(e.message.contains(why), "{json}: {}", e.message);
        }
    }
}
