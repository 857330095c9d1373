//! What the emitters work from: every type of the descriptor set with the
//! Rust module it is generated into, and every field joined with its schema
//! table entry (offsets, hasbit, oneof case word) — the layout the generated
//! code hard-codes.

use std::collections::HashMap;

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};
use protoplane_schema::{Field, FieldFlags, Kind, Message, TableSet};

use crate::names::{camel, ident, package_path, snake, type_ident};
use crate::Error;

/// Where a message or enum type is generated.
#[derive(Clone, Debug)]
pub(crate) struct TypeLoc {
    /// Proto package.
    pub(crate) package: String,
    /// Absolute module path of the module the type is emitted into
    /// (package modules, then one module per enclosing message).
    pub(crate) module: Vec<String>,
    /// Rust name of the type (`Post`; `Option_` for a name the prelude has).
    pub(crate) ident: String,
    /// The `UpperCamelCase` name views and builders add their suffix to
    /// (`PostView`, `OptionView`).
    pub(crate) base: String,
    /// A synthesized `map<K, V>` entry (no view or builder is generated).
    pub(crate) map_entry: bool,
}

impl TypeLoc {
    /// The module that holds this message's nested types.
    pub(crate) fn inner_module(&self, proto_name: &str) -> Vec<String> {
        let mut m = self.module.clone();
        m.push(ident(&snake(proto_name)));
        m
    }
}

/// All types of a descriptor set, by fully qualified name (no leading dot).
#[derive(Debug, Default)]
pub(crate) struct Types {
    pub(crate) by_name: HashMap<String, TypeLoc>,
}

impl Types {
    pub(crate) fn new(set: &FileDescriptorSet) -> Types {
        let mut t = Types::default();
        for file in &set.file {
            let package = file.package().to_owned();
            let module = package_path(&package);
            t.collect(&package, &package, &module, &file.message_type, &file.enum_type);
        }
        t
    }

    fn collect(
        &mut self,
        package: &str,
        prefix: &str,
        module: &[String],
        msgs: &[DescriptorProto],
        enums: &[EnumDescriptorProto],
    ) {
        let join = |n: &str| if prefix.is_empty() { n.to_owned() } else { format!("{prefix}.{n}") };
        for e in enums {
            self.by_name.insert(
                join(e.name()),
                TypeLoc {
                    package: package.to_owned(),
                    module: module.to_vec(),
                    ident: type_ident(e.name()),
                    base: camel(e.name()),
                    map_entry: false,
                },
            );
        }
        for m in msgs {
            let full = join(m.name());
            let loc = TypeLoc {
                package: package.to_owned(),
                module: module.to_vec(),
                ident: type_ident(m.name()),
                base: camel(m.name()),
                map_entry: m.options.as_ref().and_then(|o| o.map_entry) == Some(true),
            };
            let inner = loc.inner_module(m.name());
            self.by_name.insert(full.clone(), loc);
            self.collect(package, &full, &inner, &m.nested_type, &m.enum_type);
        }
    }

    pub(crate) fn get(&self, full_name: &str) -> Result<&TypeLoc, Error> {
        let name = full_name.strip_prefix('.').unwrap_or(full_name);
        self.by_name.get(name).ok_or_else(|| Error::Unsupported(format!("unresolved type {name}")))
    }
}

/// One field of a message: its descriptor name joined with its table entry.
#[derive(Clone, Debug)]
pub(crate) struct FieldInfo {
    /// Declared name.
    pub(crate) name: String,
    /// The table entry (offset, presence, kind, flags, sub-table).
    pub(crate) field: Field,
    /// Position in number order: the index into the marker's `FIELD_OPS`.
    pub(crate) op_index: usize,
    /// Fully qualified name of the message / enum type, if any.
    pub(crate) type_name: Option<String>,
    /// Real oneof the field belongs to: `(index, case word offset)`.
    pub(crate) oneof: Option<(usize, u32)>,
}

impl FieldInfo {
    pub(crate) fn kind(&self) -> Kind {
        self.field.kind
    }

    pub(crate) fn is_repeated(&self) -> bool {
        self.field.is_repeated()
    }

    pub(crate) fn is_map(&self) -> bool {
        self.field.flags.has(FieldFlags::MAP)
    }

    /// Explicit presence: `has_x()` is generated (everything but proto3
    /// implicit-presence singular fields and repeated fields).
    pub(crate) fn has_presence(&self) -> bool {
        !self.is_repeated() && !self.field.flags.has(FieldFlags::IMPLICIT)
    }

    /// The `.proto` spelling of the field's type, for doc comments.
    pub(crate) fn proto_type(&self) -> String {
        match self.kind() {
            Kind::Message | Kind::Group | Kind::Enum => {
                self.type_name.clone().unwrap_or_default().trim_start_matches('.').to_owned()
            }
            k => k.proto_name().to_owned(),
        }
    }
}

/// One real (non-synthetic) oneof.
#[derive(Clone, Debug)]
pub(crate) struct OneofInfo {
    pub(crate) name: String,
    pub(crate) case_offset: u32,
    /// Indices into the message's `fields` (declaration order).
    pub(crate) members: Vec<usize>,
}

/// One message joined with its table.
#[derive(Debug)]
pub(crate) struct MessageInfo {
    pub(crate) full_name: String,
    pub(crate) type_index: u32,
    pub(crate) table: Message,
    /// Fields in declaration order.
    pub(crate) fields: Vec<FieldInfo>,
    pub(crate) oneofs: Vec<OneofInfo>,
}

impl MessageInfo {
    pub(crate) fn new(
        ts: &TableSet,
        full_name: &str,
        desc: &DescriptorProto,
    ) -> Result<MessageInfo, Error> {
        let type_index = ts
            .message_by_name(full_name)
            .ok_or_else(|| Error::Unsupported(format!("{full_name} is not in the tables")))?;
        let table = *ts.message(type_index);
        let table_fields = ts.fields(&table);
        let table_oneofs = ts.oneofs(&table);
        let mut fields = Vec::with_capacity(desc.field.len());
        let mut oneofs: Vec<OneofInfo> = table_oneofs
            .iter()
            .map(|o| OneofInfo {
                name: ts.str(o.name).to_owned(),
                case_offset: o.case_offset,
                members: Vec::new(),
            })
            .collect();
        for fd in &desc.field {
            let number = fd.number() as u32;
            let op_index = ts.field_index(&table, number).ok_or_else(|| {
                Error::Unsupported(format!("{full_name}.{}: not in the tables", fd.name()))
            })?;
            let field = table_fields[op_index];
            let oneof = if field.flags.has(FieldFlags::ONEOF) {
                let o = table_oneofs.get(field.presence as usize).ok_or_else(|| {
                    Error::Unsupported(format!("{full_name}.{}: bad oneof", fd.name()))
                })?;
                oneofs[field.presence as usize].members.push(fields.len());
                Some((field.presence as usize, o.case_offset))
            } else {
                None
            };
            let type_name = fd
                .type_name
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(|t| t.trim_start_matches('.').to_owned());
            fields.push(FieldInfo {
                name: fd.name().to_owned(),
                field,
                op_index,
                type_name,
                oneof,
            });
        }
        Ok(MessageInfo { full_name: full_name.to_owned(), type_index, table, fields, oneofs })
    }
}
