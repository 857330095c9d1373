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
//! `GRPC_XDS_BOOTSTRAP_CONFIG` itself. The first server is used; its
//! credentials must include `insecure` (TLS to the management server is
//! not supported yet, and a bootstrap that asks only for it is refused
//! rather than silently downgraded). Unknown fields are ignored.

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
    /// (region, zone, sub_zone).
    pub locality: (String, String, String),
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
        if !kinds.iter().any(|k| k == "insecure") {
            return Err(bad(format!(
                "xds_servers[0].channel_creds {kinds:?}: only \"insecure\" is supported"
            )));
        }
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
                r#"{"xds_servers": [{"server_uri": "x:1", "channel_creds": [{"type": "tls"}]}]}"#,
                "insecure",
            ),
            (r#"{"xds_servers": [{"server_uri": 5}]}"#, "not a string"),
            ("not json", "bootstrap"),
        ] {
            let e = Bootstrap::from_json(json).expect_err(json);
            assert!(e.message.contains(why), "{json}: {}", e.message);
        }
    }
}
