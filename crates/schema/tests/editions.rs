//! Editions schemas lower into the tables of the proto2 or proto3 schema
//! with the same encoding: each feature, resolved from the edition's
//! defaults down through file, message, oneof and field, sets the table bit
//! the syntax would have set. From `.proto` text (rewritten for protox) and
//! from descriptor bytes as protoc writes them (`edition` field, interpreted
//! `features` options).

use prost::Message as _;
use protoplane_schema::{
    compile_proto_sources, FieldFlags, Kind, Label, MessageFlags, ProtoSource, TableSet,
};

const E2023: &str = r#"
// Features at every level: file, message, oneof, field, enum.
edition = "2023";
package ed;
option features.utf8_validation = NONE;

enum Open { OPEN_ZERO = 0; OPEN_ONE = 1; }
enum Closed { option features.enum_type = CLOSED; CLOSED_ONE = 1; }

message M {
  int32 explicit = 1;
  int32 implicit = 2 [features.field_presence = IMPLICIT];
  int32 required = 3 [features.field_presence = LEGACY_REQUIRED];
  repeated int32 packed = 4;
  repeated int32 expanded = 5 [features.repeated_field_encoding = EXPANDED];
  string unchecked = 6;
  string checked = 7 [features.utf8_validation = VERIFY];
  M length_prefixed = 8;
  M delimited = 9 [features.message_encoding = DELIMITED];
  Open open = 10;
  Closed closed = 11;
  map<string, M> map = 12;
  oneof choice { int32 c = 13; }
  reserved gone, also_gone;
  reserved 100 to 110;
}

message ImplicitByDefault {
  option features.field_presence = IMPLICIT;
  option features.message_encoding = DELIMITED;
  int32 a = 1;
  ImplicitByDefault sub = 2;
  map<int32, ImplicitByDefault> entries = 3;
  message Inner { int32 b = 1 [features.field_presence = EXPLICIT]; int32 c = 2; }
}
"#;

fn load(text: &str) -> TableSet {
    let src = [ProtoSource { name: "ed.proto", text }];
    TableSet::from_proto_sources(&src, &["ed.proto"]).expect("the editions file loads")
}

fn field<'a>(ts: &'a TableSet, msg: &str, name: &str) -> &'a protoplane_schema::Field {
    let m = ts.message(ts.message_by_name(msg).unwrap_or_else(|| panic!("no {msg}")));
    ts.field_by_name(m, name).unwrap_or_else(|| panic!("no {msg}.{name}"))
}

fn check_e2023(ts: &TableSet) {
    let f = |name: &str| *field(ts, "ed.M", name);
    let has = |name: &str, flag: u16| f(name).flags.has(flag);
    assert!(!has("explicit", FieldFlags::IMPLICIT));
    assert!(has("implicit", FieldFlags::IMPLICIT));
    assert_eq!(f("required").label, Label::Required);
    assert!(ts
        .message(ts.message_by_name("ed.M").expect("the test's own input"))
        .flags
        .has(MessageFlags::HAS_REQUIRED));
    assert!(has("packed", FieldFlags::PACKED));
    assert!(!has("expanded", FieldFlags::PACKED));
    assert!(!has("unchecked", FieldFlags::UTF8), "the file turns UTF-8 checks off");
    assert!(has("checked", FieldFlags::UTF8), "the field turns them back on");
    assert_eq!(f("length_prefixed").kind, Kind::Message);
    assert_eq!(f("delimited").kind, Kind::Group);
    assert!(!has("open", FieldFlags::CLOSED_ENUM));
    assert!(has("closed", FieldFlags::CLOSED_ENUM));
    assert!(has("map", FieldFlags::MAP));
    assert!(has("c", FieldFlags::ONEOF) && !has("c", FieldFlags::IMPLICIT));
    assert!(!ts.enum_type(ts.enum_by_name("ed.Open").expect("the test's own input")).closed);
    assert!(ts.enum_type(ts.enum_by_name("ed.Closed").expect("the test's own input")).closed);

    let g = |msg: &str, name: &str| *field(ts, msg, name);
    let a = g("ed.ImplicitByDefault", "a");
    assert!(a.flags.has(FieldFlags::IMPLICIT), "the message's default reaches its fields");
    assert_eq!(g("ed.ImplicitByDefault", "sub").kind, Kind::Group);
    assert!(!g("ed.ImplicitByDefault", "sub").flags.has(FieldFlags::IMPLICIT));
    // A map stays a map, and its entry's message value stays length-prefixed.
    let entries = g("ed.ImplicitByDefault", "entries");
    assert_eq!(entries.kind, Kind::Message);
    assert!(entries.flags.has(FieldFlags::MAP));
    let entry = ts.message(entries.sub);
    let value = ts.fields(entry).iter().find(|f| f.number == 2).expect("the test's own input");
    assert_eq!(value.kind, Kind::Message);
    // Nested messages inherit; a field can take explicit presence back.
    assert!(!g("ed.ImplicitByDefault.Inner", "b").flags.has(FieldFlags::IMPLICIT));
    assert!(g("ed.ImplicitByDefault.Inner", "c").flags.has(FieldFlags::IMPLICIT));
}

#[test]
fn features_resolve_into_the_table_bits() {
    check_e2023(&load(E2023));
}

#[test]
fn edition_2024_reads_like_2023() {
    let text = E2023
        .replace("edition = \"2023\";", "edition = \"2024\";")
        .replace("enum Open {", "export enum Open {");
    check_e2023(&load(&text));
}

#[test]
fn the_descriptor_set_carries_the_features_through_its_bytes() {
    let src = [ProtoSource { name: "ed.proto", text: E2023 }];
    let set = compile_proto_sources(&src, &["ed.proto"]).expect("the test's own input");
    let file = set.file.iter().find(|f| f.name() == "ed.proto").expect("the test's own input");
    assert_eq!(file.syntax(), "editions");
    // Through `encode_to_vec` (features as uninterpreted options) and back.
    check_e2023(
        &TableSet::from_descriptor_set(&set.encode_to_vec()).expect("the test's own input"),
    );
    check_e2023(&TableSet::from_file_descriptor_set(&set).expect("the test's own input"));
}

/// Appends field `number` (length-delimited) to `out`.
fn len_field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// A `FileDescriptorSet` as protoc writes an editions file: `syntax =
/// "editions"`, `edition = EDITION_2023` (field 14) and `features` as
/// interpreted options (`FileOptions` 50, `MessageOptions` 12,
/// `FieldOptions` 21, `EnumOptions` 7), none of which `prost_types` keeps.
fn protoc_style(edition: u64) -> Vec<u8> {
    use prost_types::field_descriptor_proto::{Label, Type};
    use prost_types::{
        DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    };
    let field = |name: &str, number: i32, ty: Type, type_name: Option<&str>| FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(ty as i32),
        type_name: type_name.map(Into::into),
        ..Default::default()
    };
    // features { field_presence: IMPLICIT } on `a`; { message_encoding:
    // DELIMITED } on `sub`; { enum_type: CLOSED } on the enum; the file says
    // utf8_validation: NONE (3, protoc 26+) and the message packs nothing.
    let feature = |n: u32, v: u64| {
        let mut set = Vec::new();
        prost::encoding::encode_key(n, prost::encoding::WireType::Varint, &mut set);
        prost::encoding::encode_varint(v, &mut set);
        set
    };
    let mut a = field("a", 1, Type::Int32, None).encode_to_vec();
    let mut opts = Vec::new();
    len_field(&mut opts, 21, &feature(1, 2));
    len_field(&mut a, 8, &opts);
    let mut sub = field("sub", 2, Type::Message, Some(".pe.M")).encode_to_vec();
    let mut opts = Vec::new();
    len_field(&mut opts, 21, &feature(5, 2));
    len_field(&mut sub, 8, &opts);
    let s = field("s", 3, Type::String, None);
    let e = field("e", 4, Type::Enum, Some(".pe.E"));
    let r = FieldDescriptorProto {
        label: Some(Label::Repeated as i32),
        ..field("r", 5, Type::Int32, None)
    };
    let mut m =
        DescriptorProto { name: Some("M".into()), field: vec![s, e, r], ..Default::default() }
            .encode_to_vec();
    len_field(&mut m, 2, &a);
    len_field(&mut m, 2, &sub);
    let mut opts = Vec::new();
    len_field(&mut opts, 12, &feature(3, 2));
    len_field(&mut m, 7, &opts);
    let mut en = EnumDescriptorProto {
        name: Some("E".into()),
        value: vec![EnumValueDescriptorProto {
            name: Some("ONE".into()),
            number: Some(1),
            options: None,
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let mut opts = Vec::new();
    len_field(&mut opts, 7, &feature(2, 2));
    len_field(&mut en, 3, &opts);

    let mut file = prost_types::FileDescriptorProto {
        name: Some("pe.proto".into()),
        package: Some("pe".into()),
        syntax: Some("editions".into()),
        ..Default::default()
    }
    .encode_to_vec();
    len_field(&mut file, 4, &m);
    len_field(&mut file, 5, &en);
    let mut opts = Vec::new();
    len_field(&mut opts, 50, &feature(4, 3));
    len_field(&mut file, 8, &opts);
    prost::encoding::encode_key(14, prost::encoding::WireType::Varint, &mut file);
    prost::encoding::encode_varint(edition, &mut file);
    let mut set = Vec::new();
    len_field(&mut set, 1, &file);
    set
}

#[test]
fn protoc_descriptor_sets_with_interpreted_features_load() {
    let ts = TableSet::from_descriptor_set(&protoc_style(1000)).expect("the test's own input");
    let f = |name: &str| *field(&ts, "pe.M", name);
    assert!(f("a").flags.has(FieldFlags::IMPLICIT));
    assert_eq!(f("sub").kind, Kind::Group);
    assert!(!f("s").flags.has(FieldFlags::UTF8), "utf8_validation = NONE from the file");
    assert!(f("e").flags.has(FieldFlags::CLOSED_ENUM));
    assert!(!f("r").flags.has(FieldFlags::PACKED), "the message's EXPANDED");
}

#[test]
fn an_unknown_edition_is_refused_by_name() {
    let e = TableSet::from_descriptor_set(&protoc_style(9999)).expect_err("refused").to_string();
    assert!(e.contains("pe.proto: edition 9999"), "{e}");
    let src = [ProtoSource { name: "x.proto", text: "edition = \"2025\";\nmessage A {}\n" }];
    let e = TableSet::from_proto_sources(&src, &["x.proto"]).expect_err("refused").to_string();
    assert!(e.contains("edition \"2025\""), "{e}");
}

#[test]
fn labels_editions_forbid_are_refused_with_the_line() {
    let src = [ProtoSource {
        name: "x.proto",
        text: "edition = \"2023\";\nmessage A {\n  required int32 a = 1;\n}\n",
    }];
    let e = TableSet::from_proto_sources(&src, &["x.proto"]).expect_err("refused").to_string();
    assert!(e.contains("x.proto: line 3: label `required`"), "{e}");
}

#[test]
fn a_bad_feature_value_names_the_element() {
    use prost_types::uninterpreted_option::NamePart;
    let src = [ProtoSource { name: "ed.proto", text: E2023 }];
    let mut set = compile_proto_sources(&src, &["ed.proto"]).expect("the test's own input");
    let file = set.file.iter_mut().find(|f| f.name() == "ed.proto").expect("the test's own input");
    let m = file.message_type.iter_mut().find(|m| m.name() == "M").expect("the test's own input");
    let opts = m.field[0].options.get_or_insert_with(Default::default);
    opts.uninterpreted_option.push(prost_types::UninterpretedOption {
        name: vec![
            NamePart { name_part: "features".into(), is_extension: false },
            NamePart { name_part: "field_presence".into(), is_extension: false },
        ],
        identifier_value: Some("SOMETIMES".into()),
        ..Default::default()
    });
    let e = TableSet::from_file_descriptor_set(&set).expect_err("refused").to_string();
    assert!(e.contains("ed.M.explicit: features.field_presence = \"SOMETIMES\""), "{e}");
}

#[test]
fn enum_aliases_share_a_number_and_print_the_first_name() {
    let ts = load(
        "edition = \"2023\";\npackage ed;\n\
         enum A { option allow_alias = true; ZERO = 0; BAZ = 2; MOO = 2; moo = 2; }\n",
    );
    let e = ts.enum_type(ts.enum_by_name("ed.A").expect("the test's own input"));
    assert_eq!(ts.enum_value_name(e, 2), Some("BAZ"));
    for alias in ["BAZ", "MOO", "moo"] {
        assert_eq!(ts.enum_value_by_name(e, alias), Some(2), "{alias}");
    }
    assert!(ts.enum_contains(e, 2) && !ts.enum_contains(e, 1));
    let back = TableSet::from_bytes(&ts.to_bytes()).expect("aliases survive the byte form");
    assert_eq!(
        back.enum_value_name(
            back.enum_type(back.enum_by_name("ed.A").expect("the test's own input")),
            2
        ),
        Some("BAZ")
    );
}

#[test]
fn language_features_compile_and_change_no_table_bit() {
    let text = "edition = \"2024\";\npackage lf;\n\
                import \"google/protobuf/cpp_features.proto\";\n\
                import \"google/protobuf/java_features.proto\";\n\
                option features.(pb.cpp).string_type = VIEW;\n\
                message A {\n\
                  string s = 1 [features.(pb.cpp).string_type = CORD, features.(pb.java).utf8_validation = VERIFY];\n\
                  int32 n = 2 [features.field_presence = IMPLICIT];\n\
                }\n";
    let src = [ProtoSource { name: "lf.proto", text }];
    let ts = TableSet::from_proto_sources(&src, &["lf.proto"]).expect("compiles");
    assert!(field(&ts, "lf.A", "s").flags.has(FieldFlags::UTF8));
    assert!(field(&ts, "lf.A", "n").flags.has(FieldFlags::IMPLICIT));
}

#[test]
fn an_extension_of_a_message_the_set_leaves_out_is_skipped() {
    use prost_types::field_descriptor_proto::{Label, Type};
    // A custom option (extends FieldOptions) in a set without
    // descriptor.proto, as `protoc --descriptor_set_out` writes it without
    // --include_imports: the file's own messages still load.
    let file = prost_types::FileDescriptorProto {
        name: Some("opt.proto".into()),
        package: Some("opt".into()),
        dependency: vec!["google/protobuf/descriptor.proto".into()],
        message_type: vec![prost_types::DescriptorProto {
            name: Some("M".into()),
            field: vec![prost_types::FieldDescriptorProto {
                name: Some("a".into()),
                number: Some(1),
                label: Some(Label::Optional as i32),
                r#type: Some(Type::Int32 as i32),
                ..Default::default()
            }],
            ..Default::default()
        }],
        extension: vec![prost_types::FieldDescriptorProto {
            name: Some("tag".into()),
            number: Some(50_001),
            label: Some(Label::Optional as i32),
            r#type: Some(Type::String as i32),
            extendee: Some(".google.protobuf.FieldOptions".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let set = prost_types::FileDescriptorSet { file: vec![file] };
    let ts = TableSet::from_descriptor_set(&set.encode_to_vec()).expect("loads");
    assert!(ts.message_by_name("opt.M").is_some());
}
