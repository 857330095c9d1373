//! Asynchronous aggregation — user code. Word count: each worker counts
//! the words of its share of the corpus and sends the counts of every batch
//! (`WordCount.Count`, added into the in-network map: `Map.addTo`); a
//! reader gets the totals (`WordCount.Read`, `Map.get`). The server sees
//! the batches' names only, and `Read` never reaches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use protoplane_grpc::{Message, Request, Status};
use protoplane_wire::Block;

use crate::generated::protoplane::examples::wordcount::word_count_inc_client::WordCountIncClient;
use crate::generated::protoplane::examples::wordcount::word_count_server::WordCount;
use crate::generated::protoplane::examples::wordcount::{
    CountReply, CountRequest, CountRequestBuilder, CountRequestView, ReadReply, ReadReplyView,
    ReadRequest, ReadRequestBuilder,
};

/// A key every worker adds 1 to when it is done.
pub const DONE: &str = "\0done";

/// The server: it counts the documents it was told about.
#[derive(Debug, Default)]
pub struct WordCountService {
    /// `Count` calls that named a document.
    pub documents: AtomicU64,
}

impl WordCount for WordCountService {
    async fn count(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: CountRequestView<'_> = request.message.typed()?;
        if !req.document().is_empty() {
            self.documents.fetch_add(1, Ordering::Relaxed);
        }
        Ok(CountReply::builder().finish())
    }

    async fn read(&self, _request: Request<Message>) -> Result<Block, Status> {
        Ok(ReadReply::builder().finish())
    }
}

/// Lower-case words of letters (at most 64 bytes, the longest key).
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty() && w.len() <= 64)
        .map(str::to_lowercase)
}

async fn send(
    client: &WordCountIncClient,
    document: &str,
    counts: &HashMap<String, i64>,
) -> Result<(), Status> {
    let mut b = CountRequest::builder();
    let mut req = CountRequestBuilder::root(&mut b);
    req.set_document(document)?;
    let mut map = req.counts()?;
    for (w, n) in counts {
        map.insert_entries(w, *n)?;
    }
    client.count(Request::new(&b.finish())).await.map(|_| ())
}

/// Counts `lines` in batches of `batch` lines; returns the words sent.
pub async fn worker(
    client: &WordCountIncClient,
    lines: &[&str],
    batch: usize,
) -> Result<u64, Status> {
    worker_part(client, lines, batch, true).await
}

/// Counts `lines` in batches of `batch` lines, and says it is done if
/// `last` (a worker may do its share from several processes one after
/// another); returns the words sent.
pub async fn worker_part(
    client: &WordCountIncClient,
    lines: &[&str],
    batch: usize,
    last: bool,
) -> Result<u64, Status> {
    let mut sent = 0;
    for (i, part) in lines.chunks(batch.max(1)).enumerate() {
        let mut counts: HashMap<String, i64> = HashMap::new();
        for w in part.iter().flat_map(|l| words(l)) {
            *counts.entry(w).or_insert(0) += 1;
        }
        sent += counts.len() as u64;
        send(client, &format!("batch {i}"), &counts).await?;
    }
    if last {
        send(client, "", &HashMap::from([(DONE.to_string(), 1)])).await?;
    }
    Ok(sent)
}

/// The totals of `words`.
pub async fn read(
    client: &WordCountIncClient,
    words: &[&str],
) -> Result<HashMap<String, i64>, Status> {
    let mut b = ReadRequest::builder();
    ReadRequestBuilder::root(&mut b).words()?.extend_strs(words.iter().copied())?;
    let reply = client.read(Request::new(&b.finish())).await?;
    let reply: ReadReplyView<'_> = reply.typed()?;
    let counts =
        reply.counts().map(|c| c.entries().iter().map(|(w, n)| (w.to_string(), n)).collect());
    Ok(counts.unwrap_or_default())
}

/// Waits until `workers` are done, then reads the count of every word.
pub async fn reader(
    client: &WordCountIncClient,
    workers: i64,
    words: &[String],
) -> Result<HashMap<String, i64>, Status> {
    while read(client, &[DONE]).await?.get(DONE).copied().unwrap_or(0) < workers {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    read(client, &words.iter().map(String::as_str).collect::<Vec<_>>()).await
}
