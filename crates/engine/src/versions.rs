//! Applications that bring their own schema: another version of a service
//! than the engine was built with.
//!
//! A client sees the engine's schema (its routes, reflection, the methods
//! it decodes for); an application attached with a different table digest
//! sends its descriptor set in the HELLO (`protoplane_shm::attach`), and
//! the engine serves it with *its* tables: requests are decoded into the
//! region with the application's tables and the method ids it numbers, and
//! its response blocks are encoded with them. Two versions of a service can
//! thus be attached at once during a rolling upgrade, each instance's calls
//! laid out the way its own code reads them.
//!
//! What makes two versions compatible is what protobuf's wire format
//! tolerates: fields added or removed, renamed fields and messages. What it
//! does not tolerate is refused at attach, naming the field: a field number
//! reused with another type or cardinality, a method whose request or
//! response type changed shape that way, or whose streaming changed. A
//! method the engine has and the application lacks answers UNIMPLEMENTED on
//! that instance; one the application adds and the engine lacks cannot be
//! reached (clients route by the engine's schema).
//!
//! Schemas are built once per digest and kept ([`Versions`], bounded).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
use protoplane_grpc::Schema;

/// Schemas the engine keeps, by digest (applications of one version share
/// one); beyond this many the oldest goes.
const KEPT: usize = 32;

/// How the engine serves one service of an application whose schema
/// differs from its own.
#[derive(Debug)]
pub struct Version {
    /// The application's schema.
    pub schema: Arc<Schema>,
    /// By the engine's method id: the application's id of the same method
    /// (same path), if it has it.
    methods: Vec<Option<u32>>,
}

impl Version {
    /// The application's id of the engine's method `id`.
    pub fn method(&self, id: u32) -> Option<u32> {
        self.methods.get(id as usize).copied().flatten()
    }
}

/// Schemas built from applications' descriptor sets, by digest.
#[derive(Debug, Default)]
pub struct Versions {
    built: Mutex<Vec<(u64, Arc<Schema>)>>,
}

impl Versions {
    /// The schema of descriptor set `bytes`, which the application says has
    /// table digest `digest` (built once; checked: a set whose tables have
    /// another digest is refused).
    pub fn schema(&self, digest: u64, bytes: &[u8]) -> Result<Arc<Schema>, String> {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = built.iter().find(|(d, _)| *d == digest) {
            return Ok(s.clone());
        }
        let schema = Arc::new(
            Schema::from_descriptor_set(bytes)
                .map_err(|e| format!("the application's descriptor set: {e}"))?,
        );
        let got = schema.tables().digest();
        if got != digest {
            return Err(format!(
                "the application's descriptor set builds tables {got:016x}, not the {digest:016x} it named"
            ));
        }
        if built.len() == KEPT {
            built.remove(0);
        }
        built.push((digest, schema.clone()));
        Ok(schema)
    }
}

/// How the engine (schema `ours`) serves `service` for an application with
/// schema `theirs`, or why it cannot (naming the field or method).
pub fn compatible(ours: &Schema, theirs: &Arc<Schema>, service: &str) -> Result<Version, String> {
    if !theirs.services().iter().any(|s| s == service) {
        return Err(format!("the application's schema has no service {service}"));
    }
    let mine = Messages::of(ours.files());
    let other = Messages::of(theirs.files());
    let mut checked = HashSet::new();
    let mut methods = vec![None; ours.methods().len()];
    for (id, m) in ours.methods().iter().enumerate() {
        if m.service != service {
            continue;
        }
        let Some(tid) = theirs.method_id(&m.path) else { continue };
        let Some(t) = theirs.method(tid) else { continue };
        if (m.client_streaming, m.server_streaming) != (t.client_streaming, t.server_streaming) {
            return Err(format!(
                "method {}: {} in the engine's schema, {} in the application's",
                m.path,
                m.kind(),
                t.kind()
            ));
        }
        for (kind, a, b) in [("request", m.input, t.input), ("response", m.output, t.output)] {
            let (a, b) = (ours.tables().message_name(a), theirs.tables().message_name(b));
            if a != b {
                return Err(format!(
                    "method {}: its {kind} is {a} in the engine's schema, {b} in the application's",
                    m.path
                ));
            }
            mine.same_shape(&other, a, &mut checked)?;
        }
        methods[id] = Some(tid);
    }
    Ok(Version { schema: theirs.clone(), methods })
}

/// Message descriptors by full name (no leading dot).
struct Messages<'a>(HashMap<String, &'a DescriptorProto>);

impl<'a> Messages<'a> {
    fn of(files: &'a [FileDescriptorProto]) -> Messages<'a> {
        fn walk<'a>(
            prefix: &str,
            m: &'a DescriptorProto,
            out: &mut HashMap<String, &'a DescriptorProto>,
        ) {
            let name = format!("{prefix}.{}", m.name());
            for n in &m.nested_type {
                walk(&name, n, out);
            }
            out.insert(name, m);
        }
        let mut out = HashMap::new();
        for f in files {
            let pkg = f.package();
            for m in &f.message_type {
                walk(pkg, m, &mut out);
            }
        }
        // Keys are ".pkg.Name" or ".Name": drop the leading dot.
        Messages(out.into_iter().map(|(k, v)| (k.trim_start_matches('.').to_string(), v)).collect())
    }

    /// Checks that every field number message `name` has in both schemas
    /// has the same type and cardinality, through nested messages.
    fn same_shape(
        &self,
        other: &Messages<'_>,
        name: &str,
        checked: &mut HashSet<String>,
    ) -> Result<(), String> {
        if !checked.insert(name.to_string()) {
            return Ok(());
        }
        let (Some(a), Some(b)) = (self.0.get(name), other.0.get(name)) else {
            // Renamed or missing on one side: the method check already
            // compared the names of the top-level types.
            return Ok(());
        };
        for fa in &a.field {
            let Some(fb) = b.field.iter().find(|f| f.number() == fa.number()) else { continue };
            let (ta, tb) = (shape(fa), shape(fb));
            if ta != tb {
                return Err(format!(
                    "field {name}.{} (number {}): {ta} in the engine's schema, {tb} in the application's ({})",
                    fa.name(),
                    fa.number(),
                    fb.name()
                ));
            }
            if fa.r#type() == Type::Message || fa.r#type() == Type::Group {
                let nested = fa.type_name().trim_start_matches('.');
                self.same_shape(other, nested, checked)?;
            }
        }
        Ok(())
    }
}

/// A field's type and cardinality as the wire sees them: the scalar type,
/// or the message or enum type's name; `repeated` or not (a map is a
/// repeated message).
fn shape(f: &FieldDescriptorProto) -> String {
    let ty = match f.r#type() {
        Type::Message | Type::Group | Type::Enum => {
            f.type_name().trim_start_matches('.').to_string()
        }
        t => t.as_str_name().trim_start_matches("TYPE_").to_ascii_lowercase(),
    };
    match f.label() {
        Label::Repeated => format!("repeated {ty}"),
        _ => ty,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protoplane_schema::ProtoSource;

    fn schema(text: &str) -> Arc<Schema> {
        let src = [ProtoSource { name: "kv.proto", text }];
        Arc::new(Schema::from_proto_sources(&src, &["kv.proto"]).expect("schema"))
    }

    const V1: &str = r#"
        syntax = "proto3";
        package kv;
        message Key { string name = 1; }
        message Value { string name = 1; bytes data = 2; Meta meta = 3; }
        message Meta { int64 version = 1; }
        service Store { rpc Get(Key) returns (Value); rpc Put(Value) returns (Key); }
    "#;

    #[test]
    fn an_added_field_is_compatible_and_methods_map_by_path() {
        let v2 = schema(
            r#"
            syntax = "proto3";
            package kv;
            message Key { string name = 1; }
            message Meta { int64 version = 1; string author = 2; }
            message Value { string name = 1; bytes data = 2; Meta meta = 3; repeated string tags = 4; }
            service Store { rpc Put(Value) returns (Key); rpc Get(Key) returns (Value); rpc List(Key) returns (Value); }
        "#,
        );
        let v1 = schema(V1);
        let v = compatible(&v1, &v2, "kv.Store").expect("compatible");
        let get = v1.method_id("/kv.Store/Get").expect("Get");
        assert_eq!(v.method(get), v2.method_id("/kv.Store/Get"));
        assert_ne!(v2.method_id("/kv.Store/Get"), Some(get), "numbered differently");
        // The other way round too (a rollback).
        assert!(compatible(&v2, &v1, "kv.Store").is_ok());
    }

    #[test]
    fn a_reused_field_number_is_refused_by_name() {
        let bad = schema(
            r#"
            syntax = "proto3";
            package kv;
            message Key { string name = 1; }
            message Meta { string version = 1; }
            message Value { string name = 1; bytes data = 2; Meta meta = 3; }
            service Store { rpc Get(Key) returns (Value); rpc Put(Value) returns (Key); }
        "#,
        );
        let why = compatible(&schema(V1), &bad, "kv.Store").expect_err("incompatible");
        assert!(why.contains("field kv.Meta.version (number 1): int64"), "{why}");
        assert!(why.contains("string in the application's"), "{why}");
        let repeated = schema(&V1.replace("bytes data = 2;", "repeated bytes data = 2;"));
        let why = compatible(&schema(V1), &repeated, "kv.Store").expect_err("cardinality");
        assert!(why.contains("kv.Value.data") && why.contains("repeated bytes"), "{why}");
        let streaming = schema(&V1.replace("rpc Get(Key)", "rpc Get(stream Key)"));
        let why = compatible(&schema(V1), &streaming, "kv.Store").expect_err("streaming");
        assert!(why.contains("/kv.Store/Get") && why.contains("client streaming"), "{why}");
    }

    #[test]
    fn the_fuzz_target_holds_on_its_seeds() {
        use prost::Message as _;
        let base = crate::fuzzing::VERSIONS_PROTO;
        for text in [
            base.to_string(),
            base.replace("int64 version = 2;", "string version = 2;"),
            base.replace("rpc Get(Key)", "rpc Get(stream Key)"),
        ] {
            let s = schema(&text);
            let bytes = prost_types::FileDescriptorSet { file: s.files().to_vec() }.encode_to_vec();
            crate::fuzzing::versions(&bytes);
            crate::fuzzing::versions(&bytes[..bytes.len() / 2]);
        }
    }

    /// Found by the `versions` fuzz target: a hand-made descriptor set whose
    /// service had two methods without a name (both at `/kv.Store/`), so a
    /// schema was not compatible with itself. Such a set is refused now,
    /// and so is one method path declared twice.
    #[test]
    fn nameless_or_repeated_methods_are_refused() {
        use prost::Message as _;
        let v1 = schema(V1);
        let mut files = v1.files().to_vec();
        let methods = &mut files[0].service[0].method;
        let refused = |files: Vec<FileDescriptorProto>| {
            let bytes = prost_types::FileDescriptorSet { file: files }.encode_to_vec();
            crate::fuzzing::versions(&bytes);
            Schema::from_descriptor_set(&bytes).expect_err("refused").to_string()
        };
        let mut nameless = methods.clone();
        nameless.iter_mut().for_each(|m| m.name = None);
        *methods = nameless;
        assert!(refused(files.clone()).contains("a method without a name"));
        let mut twice = v1.files().to_vec();
        let again = twice[0].service[0].method[0].clone();
        twice[0].service[0].method.push(again);
        assert!(refused(twice).contains("/kv.Store/Get is declared twice"));
    }

    #[test]
    fn schemas_are_built_once_per_digest_and_checked() {
        use prost::Message as _;
        let v1 = schema(V1);
        let bytes = prost_types::FileDescriptorSet { file: v1.files().to_vec() }.encode_to_vec();
        let d = v1.tables().digest();
        let cache = Versions::default();
        let a = cache.schema(d, &bytes).expect("builds");
        let b = cache.schema(d, b"not even a descriptor set").expect("cached by digest");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(cache.schema(d ^ 1, &bytes).expect_err("wrong digest").contains("not the"));
        assert!(cache.schema(7, &[0xff, 0xff]).is_err());
    }
}
