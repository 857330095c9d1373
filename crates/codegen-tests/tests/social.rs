//! The repository's social-network schema, generated from the unchanged
//! `.proto`: every request built with the typed builders is byte-identical to
//! prost's encoding of the same values, and reads back through the typed
//! views after an owned and a view-mode decode.

mod common;

use std::collections::BTreeMap;
use std::error::Error;

use protoplane_codegen_tests::socialnetwork as sn;
use protoplane_wire::Block;

use common::{decode_both, encode, Rng};

type Res = Result<(), Box<dyn Error>>;

#[derive(Clone, PartialEq, prost::Message)]
struct Creator {
    #[prost(int64, tag = "1")]
    user_id: i64,
    #[prost(string, tag = "2")]
    username: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Media {
    #[prost(int64, tag = "1")]
    media_id: i64,
    #[prost(string, tag = "2")]
    media_type: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Url {
    #[prost(string, tag = "1")]
    shortened_url: String,
    #[prost(string, tag = "2")]
    expanded_url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Post {
    #[prost(int64, tag = "1")]
    post_id: i64,
    #[prost(message, optional, tag = "2")]
    creator: Option<Creator>,
    #[prost(int64, tag = "3")]
    req_id: i64,
    #[prost(string, tag = "4")]
    text: String,
    #[prost(message, repeated, tag = "5")]
    user_mentions: Vec<Creator>,
    #[prost(message, repeated, tag = "6")]
    media: Vec<Media>,
    #[prost(message, repeated, tag = "7")]
    urls: Vec<Url>,
    #[prost(int64, tag = "8")]
    timestamp: i64,
    #[prost(int32, tag = "9")]
    post_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StorePostRequest {
    #[prost(int64, tag = "1")]
    req_id: i64,
    #[prost(message, optional, tag = "2")]
    post: Option<Post>,
    #[prost(btree_map = "string, string", tag = "3")]
    carrier: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ComposePostRequest {
    #[prost(int64, tag = "1")]
    req_id: i64,
    #[prost(string, tag = "2")]
    username: String,
    #[prost(int64, tag = "3")]
    user_id: i64,
    #[prost(string, tag = "4")]
    text: String,
    #[prost(int64, repeated, tag = "5")]
    media_ids: Vec<i64>,
    #[prost(string, repeated, tag = "6")]
    media_types: Vec<String>,
    #[prost(int32, tag = "7")]
    post_type: i32,
    #[prost(btree_map = "string, string", tag = "8")]
    carrier: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RegisterUserRequest {
    #[prost(int64, tag = "1")]
    req_id: i64,
    #[prost(string, tag = "2")]
    first_name: String,
    #[prost(string, tag = "3")]
    last_name: String,
    #[prost(string, tag = "4")]
    username: String,
    #[prost(string, tag = "5")]
    password: String,
    #[prost(btree_map = "string, string", tag = "6")]
    carrier: BTreeMap<String, String>,
}

fn carrier(r: &mut Rng) -> BTreeMap<String, String> {
    (0..r.below(3)).map(|_| (format!("k{}", r.word(8)), format!("{:016x}", r.next()))).collect()
}

fn creator(r: &mut Rng) -> Creator {
    Creator { user_id: r.below(1 << 40) as i64, username: r.word(12) }
}

fn post(r: &mut Rng) -> Post {
    Post {
        post_id: r.next() as i64,
        creator: if r.chance(4) { None } else { Some(creator(r)) },
        req_id: r.next() as i64 >> 1,
        text: (0..r.below(20)).map(|_| r.word(8)).collect::<Vec<_>>().join(" "),
        user_mentions: (0..r.below(3)).map(|_| creator(r)).collect(),
        media: (0..r.below(3))
            .map(|_| Media { media_id: r.next() as i64, media_type: "image/png".into() })
            .collect(),
        urls: (0..r.below(2))
            .map(|_| Url {
                shortened_url: format!("http://sn.example/{}", r.word(6)),
                expanded_url: format!("https://{}.example/{}", r.word(8), r.word(30)),
            })
            .collect(),
        timestamp: 1_700_000_000_000 + r.below(1 << 30) as i64,
        post_type: r.below(4) as i32,
    }
}

fn build_post(b: &mut sn::PostBuilder<'_, '_>, p: &Post) -> Res {
    b.set_post_id(p.post_id).set_req_id(p.req_id).set_timestamp(p.timestamp);
    b.set_post_type(p.post_type);
    if let Some(c) = &p.creator {
        b.creator()?.set_user_id(c.user_id).set_username(&c.username)?;
    }
    b.set_text(&p.text)?;
    for m in &p.user_mentions {
        b.add_user_mentions()?.set_user_id(m.user_id).set_username(&m.username)?;
    }
    for m in &p.media {
        b.add_media()?.set_media_id(m.media_id).set_media_type(&m.media_type)?;
    }
    for u in &p.urls {
        b.add_urls()?.set_shortened_url(&u.shortened_url)?.set_expanded_url(&u.expanded_url)?;
    }
    Ok(())
}

fn check_post(v: sn::PostView<'_>, p: &Post) {
    assert_eq!((v.post_id(), v.req_id(), v.timestamp()), (p.post_id, p.req_id, p.timestamp));
    assert_eq!(sn::PostType::try_from(v.post_type()).map(i32::from), Ok(p.post_type));
    assert_eq!(v.text(), p.text);
    assert_eq!(
        v.creator().map(|c| (c.user_id(), c.username())),
        p.creator.as_ref().map(|c| (c.user_id, c.username.as_str()))
    );
    let mentions: Vec<(i64, &str)> =
        v.user_mentions().iter().map(|m| (m.user_id(), m.username())).collect();
    assert_eq!(
        mentions,
        p.user_mentions.iter().map(|m| (m.user_id, m.username.as_str())).collect::<Vec<_>>()
    );
    let media: Vec<(i64, &str)> =
        v.media().iter().map(|m| (m.media_id(), m.media_type())).collect();
    assert_eq!(
        media,
        p.media.iter().map(|m| (m.media_id, m.media_type.as_str())).collect::<Vec<_>>()
    );
    assert_eq!(v.urls().len(), p.urls.len());
    for (u, e) in v.urls().iter().zip(&p.urls) {
        assert_eq!(
            (u.shortened_url(), u.expanded_url()),
            (e.shortened_url.as_str(), e.expanded_url.as_str())
        );
    }
}

fn check_carrier(m: sn::_protoplane::Map<'_, &str, &str>, e: &BTreeMap<String, String>) {
    let got: BTreeMap<String, String> =
        m.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    assert_eq!(&got, e);
}

/// Typed build == prost encode, then the typed views read the values back
/// from the built block and from both decodes of prost's bytes.
fn compare<M: prost::Message>(ty: u32, built: Block, expected: &M, check: &dyn Fn(&[u8], &[u8])) {
    let ours = encode(sn::tables(), ty, &built);
    assert_eq!(ours, expected.encode_to_vec());
    check(built.as_bytes(), &[]);
    let (owned, view) = decode_both(sn::tables(), ty, &ours);
    check(owned.as_bytes(), &[]);
    check(view.as_bytes(), &ours);
}

#[test]
fn store_post_requests() -> Res {
    let mut r = Rng(0x57_0e);
    for _ in 0..200 {
        let req = StorePostRequest {
            req_id: r.next() as i64,
            post: if r.chance(5) { None } else { Some(post(&mut r)) },
            carrier: carrier(&mut r),
        };
        let mut b = sn::StorePostRequest::builder();
        let mut s = sn::StorePostRequestBuilder::root(&mut b);
        s.set_req_id(req.req_id);
        if let Some(p) = &req.post {
            build_post(&mut s.post()?, p)?;
        }
        for (k, v) in &req.carrier {
            s.insert_carrier(k, v)?;
        }
        compare(sn::StorePostRequest::TYPE_INDEX, b.finish(), &req, &|block, wire| {
            let v = sn::StorePostRequestView::from_block(block, wire).expect("view");
            assert_eq!(v.req_id(), req.req_id);
            assert_eq!(v.has_post(), req.post.is_some());
            if let (Some(pv), Some(p)) = (v.post(), &req.post) {
                check_post(pv, p);
            }
            check_carrier(v.carrier(), &req.carrier);
        });
    }
    Ok(())
}

#[test]
fn compose_post_requests() -> Res {
    let mut r = Rng(0xc0_3905e);
    for _ in 0..200 {
        let n = r.below(4) as usize;
        let req = ComposePostRequest {
            req_id: r.next() as i64,
            username: r.word(10),
            user_id: r.below(1 << 40) as i64,
            text: r.word(60),
            media_ids: (0..n).map(|_| r.next() as i64).collect(),
            media_types: (0..n).map(|_| "video/mp4".to_owned()).collect(),
            post_type: r.below(4) as i32,
            carrier: carrier(&mut r),
        };
        let mut b = sn::ComposePostRequest::builder();
        let mut c = sn::ComposePostRequestBuilder::root(&mut b);
        c.set_req_id(req.req_id).set_user_id(req.user_id).set_post_type(req.post_type);
        c.set_username(&req.username)?.set_text(&req.text)?;
        c.extend_media_ids(req.media_ids.iter().copied())?;
        c.extend_media_types(req.media_types.iter().map(String::as_str))?;
        for (k, v) in &req.carrier {
            c.insert_carrier(k, v)?;
        }
        compare(sn::ComposePostRequest::TYPE_INDEX, b.finish(), &req, &|block, wire| {
            let v = sn::ComposePostRequestView::from_block(block, wire).expect("view");
            assert_eq!(
                (v.req_id(), v.user_id(), v.post_type()),
                (req.req_id, req.user_id, req.post_type)
            );
            assert_eq!((v.username(), v.text()), (req.username.as_str(), req.text.as_str()));
            assert_eq!(v.media_ids().to_vec(), req.media_ids);
            assert_eq!(v.media_types().to_vec(), req.media_types);
            check_carrier(v.carrier(), &req.carrier);
        });
    }
    Ok(())
}

#[test]
fn register_user_requests() -> Res {
    let mut r = Rng(0x5e9);
    for _ in 0..100 {
        let req = RegisterUserRequest {
            req_id: r.next() as i64,
            first_name: r.word(10),
            last_name: r.word(10),
            username: r.word(10),
            password: r.word(10),
            carrier: carrier(&mut r),
        };
        let mut b = sn::RegisterUserRequest::builder();
        let mut u = sn::RegisterUserRequestBuilder::root(&mut b);
        u.set_req_id(req.req_id);
        u.set_first_name(&req.first_name)?.set_last_name(&req.last_name)?;
        u.set_username(&req.username)?.set_password(&req.password)?;
        for (k, v) in &req.carrier {
            u.insert_carrier(k, v)?;
        }
        compare(sn::RegisterUserRequest::TYPE_INDEX, b.finish(), &req, &|block, wire| {
            let v = sn::RegisterUserRequestView::from_block(block, wire).expect("view");
            assert_eq!(v.req_id(), req.req_id);
            assert_eq!(
                (v.first_name(), v.last_name()),
                (req.first_name.as_str(), req.last_name.as_str())
            );
            assert_eq!(
                (v.username(), v.password()),
                (req.username.as_str(), req.password.as_str())
            );
            check_carrier(v.carrier(), &req.carrier);
        });
    }
    Ok(())
}

#[test]
fn the_dynamic_builder_and_the_typed_view_meet() -> Res {
    // A block laid out with the dynamic builder (as the CLI demo does) reads
    // through the typed view, and a typed builder's block through the
    // dynamic view: both sides use the same tables.
    use protoplane_wire::{Builder, MessageView, Source, Value};
    let mut b = Builder::new(sn::tables(), sn::LoginRequest::TYPE_INDEX)?;
    let root = b.root();
    b.set(root, 1, Value::I64(9))?;
    b.set(root, 2, Value::String(b"ada"))?;
    let e = b.message(root, 4)?;
    b.set(e, 1, Value::String(b"trace"))?;
    b.set(e, 2, Value::String(b"abc"))?;
    let block = b.finish();
    let v = sn::LoginRequestView::from_block(block.as_bytes(), &[])?;
    assert_eq!((v.req_id(), v.username(), v.password()), (9, "ada", ""));
    assert_eq!(v.carrier().get("trace"), Some("abc"));

    let mut b = sn::LoginReply::builder();
    sn::LoginReplyBuilder::root(&mut b).set_token("t0k3n")?;
    let block = b.finish();
    let d = MessageView::new(
        sn::tables(),
        Source::owned(block.as_bytes()),
        sn::LoginReply::TYPE_INDEX,
    )?;
    assert_eq!(d.by_name("token")?.and_then(|v| v.as_str()), Some("t0k3n"));
    Ok(())
}

#[test]
fn the_crate_docs_example() -> Res {
    // Keep in sync with the usage example in protoplane-codegen's crate docs.
    use sn::{Post, PostBuilder, PostView};

    let mut b = Post::builder(); // a protoplane_wire::Builder rooted at a Post
    let mut post = PostBuilder::root(&mut b);
    post.set_post_id(7).set_timestamp(1_700_000_000);
    post.set_text("hello")?;
    post.creator()?.set_user_id(42).set_username("ada")?;
    post.add_urls()?.set_shortened_url("https://sn.example/x")?;
    let block = b.finish(); // a linearized block: hand it to the engine to encode

    let view = PostView::from_block(block.as_bytes(), &[])?;
    assert_eq!(view.text(), "hello");
    assert_eq!(view.creator().map(|c| c.user_id()), Some(42));
    let urls: Vec<&str> = view.urls().iter().map(|u| u.shortened_url()).collect();
    assert_eq!(urls, ["https://sn.example/x"]);
    Ok(())
}
