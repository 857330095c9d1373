//! Where a command gets its schema: `.proto` files (with `-I` import roots)
//! or a serialized `FileDescriptorSet`, or a table set written by
//! `protoplane compile --tables-out`.

use std::path::PathBuf;

use protoplane_schema::TableSet;

#[derive(clap::Args, Debug)]
pub(crate) struct SchemaArgs {
    /// A .proto file to load (repeatable).
    #[arg(long = "proto", value_name = "FILE")]
    protos: Vec<PathBuf>,
    /// An import root for .proto files (repeatable).
    #[arg(short = 'I', long = "include", value_name = "DIR")]
    includes: Vec<PathBuf>,
    /// A serialized FileDescriptorSet (protoc --include_imports --descriptor_set_out).
    #[arg(long, value_name = "FILE")]
    descriptor_set: Option<PathBuf>,
    /// A table set written by `protoplane compile --tables-out`.
    #[arg(long, value_name = "FILE")]
    tables: Option<PathBuf>,
}

impl SchemaArgs {
    pub(crate) fn load(&self) -> Result<TableSet, String> {
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        match (&self.descriptor_set, &self.tables, self.protos.is_empty()) {
            (Some(path), None, true) => {
                TableSet::from_descriptor_set(&read(path)?).map_err(|e| e.to_string())
            }
            (None, Some(path), true) => TableSet::from_bytes(&read(path)?).map_err(|e| e.to_string()),
            (None, None, false) => {
                TableSet::from_proto_files(&self.protos, &self.includes).map_err(|e| e.to_string())
            }
            _ => Err("give exactly one schema source: --proto FILE…, --descriptor-set FILE or --tables FILE".into()),
        }
    }
}
