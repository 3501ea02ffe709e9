//! KV cache events published as vLLM publishes them (vLLM's `ZmqEventPublisher` in
//! `vllm/distributed/kv_events.py`; the scheduler owns it, as vLLM v1's does), so
//! that routers which read vLLM's (vllm-router's `kv_aware` policy, llm-d's precise prefix
//! scorer, Dynamo's KV router) see this engine's cache.
//!
//! The wire, as vLLM 0.32's `ZmqEventPublisher`:
//! - PUB socket, one multipart message per engine step that changed the cache:
//!   `[topic, seq (u64 big-endian, from 0), payload]`;
//! - payload: msgpack array `[ts (float64 seconds since the epoch), [events...], 0]` (the
//!   last field is the data-parallel rank);
//! - each event a msgpack map tagged by `"type"`: `BlockStored` (`block_hashes`,
//!   `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`,
//!   `extra_keys`, `group_idx`) or `BlockRemoved` (`block_hashes`, `medium`, `group_idx`);
//!   hashes are 32-byte msgpack bin values;
//! - replay, on a ROUTER socket: a request `[identity, "", start_seq (u64 BE)]` is answered
//!   with `[identity, "", topic, seq, payload]` for every kept batch from `start_seq` on,
//!   then `[identity, "", "", -1 (i64 BE), ""]`.
//!
//! The engine thread only queues a batch (`publish` never waits: where vLLM's queue would
//! block the engine, events the queue has no room for go with the next batch); a thread of
//! its own serialises and sends them, and serves replay requests. Endpoints are always
//! bound (vLLM connects to an endpoint without a wildcard; we have no connecting mode).

use std::collections::VecDeque;
use std::thread::JoinHandle;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::config::KvEventsConfig;
use crate::core::kv_events::KvCacheEvent;

/// vLLM calls its primary cache, the one attention reads, "GPU" on every platform; routers
/// read it as the engine's own tier (their "CPU" is an offload tier, valued less).
const MEDIUM: &str = "GPU";

/// The end-of-replay sequence number.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    #[error("--kv-events-config: cannot bind {endpoint}: {source}")]
    Bind {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    #[error("--kv-events-config: cannot start the publisher: {0}")]
    Start(#[from] std::io::Error),
    #[error("--kv-events-config: the publisher's thread stopped while starting")]
    Stopped,
}

/// One step's events.
struct Batch {
    ts: f64,
    events: Vec<KvCacheEvent>,
}

/// Sends KV cache events from a thread of its own; stops when dropped, after sending what
/// was queued.
pub struct KvEventPublisher {
    /// The addresses bound (port 0 resolved): the PUB socket's, then the replay socket's.
    bound: Vec<String>,
    tx: Option<mpsc::Sender<Batch>>,
    thread: Option<JoinHandle<()>>,
    /// Events the queue had no room for, sent with the next batch: a router sees no gap
    /// in the sequence numbers, so a lost event would leave it wrong for good.
    pending: Vec<KvCacheEvent>,
    /// Batches dropped because the sending thread had stopped.
    dropped: u64,
}

impl KvEventPublisher {
    /// Starts the sending thread, which binds the sockets (an address in use is an error
    /// here, at start). The sockets live on a runtime of that thread's own, so starting
    /// works whether or not the caller runs on a tokio runtime.
    pub fn start(cfg: &KvEventsConfig) -> Result<Self, KvEventsError> {
        let (tx, rx) = mpsc::channel(cfg.max_queue_size);
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return drop(bound_tx.send(Err(KvEventsError::Start(e)))),
                };
                rt.block_on(async move {
                    match Sender::bind(&cfg).await {
                        Ok((sender, bound)) => {
                            let _ = bound_tx.send(Ok(bound));
                            sender.run(rx).await;
                        }
                        Err(e) => drop(bound_tx.send(Err(e))),
                    }
                })
            })?;
        let bound = match bound_rx.recv() {
            Ok(result) => result?,
            Err(_) => return Err(KvEventsError::Stopped),
        };
        Ok(Self {
            bound,
            tx: Some(tx),
            thread: Some(thread),
            pending: Vec::new(),
            dropped: 0,
        })
    }

    /// Where subscribers connect, and where they ask for replays (if anywhere).
    pub fn endpoints(&self) -> (&str, Option<&str>) {
        (&self.bound[0], self.bound.get(1).map(String::as_str))
    }

    /// Queues one step's events; never waits. With the queue full they wait for the next
    /// step's batch; with the sending thread gone they are dropped (and counted).
    pub fn publish(&mut self, events: Vec<KvCacheEvent>) {
        let events = if self.pending.is_empty() {
            events
        } else {
            let mut all = std::mem::take(&mut self.pending);
            all.extend(events);
            all
        };
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Batch { ts, events }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(batch)) => self.pending = batch.events,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.dropped += 1;
                if self.dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped = self.dropped,
                        "KV cache events dropped: the publisher's thread has stopped"
                    );
                }
            }
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has sent what is queued; no send
        // there waits longer than REPLY_TIMEOUT.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::warn!("the KV events thread panicked");
            }
        }
    }
}

/// How long a replay answer may wait for a client that does not read: then its replay is
/// abandoned, and live batches go on.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Binds `endpoint` and returns the address bound. `tcp://*:PORT` is ZeroMQ's "every
/// interface"; the socket library wants an address. Port 0 takes a free port.
async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<String, KvEventsError> {
    let addr = endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1);
    socket
        .bind(&addr)
        .await
        .map(|bound| bound.to_string())
        .map_err(|source| KvEventsError::Bind {
            endpoint: endpoint.to_string(),
            source,
        })
}

/// The sending thread's state.
struct Sender {
    publisher: PubSocket,
    replay: Option<RouterSocket>,
    topic: Bytes,
    /// The latest batches, for replay: (seq, payload).
    kept: VecDeque<(u64, Bytes)>,
    keep: usize,
    next_seq: u64,
}

impl Sender {
    async fn bind(cfg: &KvEventsConfig) -> Result<(Self, Vec<String>), KvEventsError> {
        let mut publisher = PubSocket::new();
        let mut bound = vec![bind(&mut publisher, &cfg.endpoint).await?];
        let mut replay = None;
        if let Some(endpoint) = &cfg.replay_endpoint {
            let mut router = RouterSocket::new();
            bound.push(bind(&mut router, endpoint).await?);
            replay = Some(router);
        }
        let sender = Self {
            publisher,
            replay,
            topic: Bytes::from(cfg.topic.clone().into_bytes()),
            kept: VecDeque::new(),
            keep: cfg.buffer_steps,
            next_seq: 0,
        };
        Ok((sender, bound))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Batch>) {
        loop {
            tokio::select! {
                batch = rx.recv() => match batch {
                    Some(batch) => self.send(&batch).await,
                    None => break,
                },
                request = recv_replay(&mut self.replay) => self.answer(request).await,
            }
        }
    }

    async fn send(&mut self, batch: &Batch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(batch.ts, &batch.events));
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload.clone(),
        ];
        if let Err(e) = self.publisher.send(message(frames)).await {
            tracing::warn!("KV events batch {seq} not sent: {e}");
        }
        if self.kept.len() == self.keep {
            self.kept.pop_front();
        }
        self.kept.push_back((seq, payload));
    }

    async fn answer(&mut self, request: Result<ZmqMessage, zeromq::ZmqError>) {
        let frames = match request {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!("KV events replay: {e}");
                return;
            }
        };
        // Big-endian of any length up to 8 bytes, as vLLM's int.from_bytes reads it.
        let start = match &frames[..] {
            [_, empty, start] if empty.is_empty() && start.len() <= 8 => {
                start.iter().fold(0u64, |n, &b| n << 8 | u64::from(b))
            }
            _ => {
                tracing::warn!(frames = frames.len(), "KV events replay: malformed request");
                return;
            }
        };
        let (id, empty) = (frames[0].clone(), Bytes::new());
        let Some(router) = &mut self.replay else {
            return;
        };
        for (seq, payload) in self.kept.iter().filter(|(s, _)| *s >= start) {
            let frames = vec![
                id.clone(),
                empty.clone(),
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            if !send_within(router, message(frames)).await {
                return;
            }
        }
        let end = vec![
            id,
            empty.clone(),
            empty.clone(),
            Bytes::from_static(&END_SEQ),
            empty,
        ];
        send_within(router, message(end)).await;
    }
}

/// Sends a replay answer, giving up after [`REPLY_TIMEOUT`]; whether it was sent.
async fn send_within(router: &mut RouterSocket, m: ZmqMessage) -> bool {
    match tokio::time::timeout(REPLY_TIMEOUT, router.send(m)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!("KV events replay: {e}");
            false
        }
        Err(_) => {
            tracing::warn!("KV events replay abandoned: the client is not reading");
            false
        }
    }
}

/// The next replay request, or never without a replay socket.
async fn recv_replay(replay: &mut Option<RouterSocket>) -> Result<ZmqMessage, zeromq::ZmqError> {
    match replay {
        Some(router) => router.recv().await,
        None => std::future::pending().await,
    }
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    // Every message here has at least two frames.
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

/// The `block_hashes` field: an array of 32-byte bin values.
fn write_hashes(w: &mut Vec<u8>, hashes: &[crate::core::kv_events::ExternalBlockHash]) {
    let _ = rmp::encode::write_str(w, "block_hashes");
    let _ = rmp::encode::write_array_len(w, hashes.len() as u32);
    for h in hashes {
        let _ = rmp::encode::write_bin(w, h);
    }
}

/// `group_idx`: 0. An entry of our prefix cache stands for its contents in every KV cache
/// group (`block_pool.rs`), and a model with one group, as most are, has only group 0.
fn write_group(w: &mut Vec<u8>) {
    let _ = rmp::encode::write_str(w, "group_idx");
    let _ = rmp::encode::write_uint(w, 0);
}

/// A batch as msgspec encodes vLLM's `KVEventBatch` (fields with their default omitted, the
/// others in declaration order; integers in their shortest form, floats as float64).
pub(crate) fn encode_batch(ts: f64, events: &[KvCacheEvent]) -> Vec<u8> {
    use rmp::encode::write_uint;
    use rmp::encode::{write_array_len, write_bin, write_f64, write_map_len, write_nil, write_str};
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    // Writing to a Vec cannot fail: the results are Infallible errors.
    let w = &mut out;
    let _ = write_array_len(w, 3);
    let _ = write_f64(w, ts);
    let _ = write_array_len(w, events.len() as u32);
    for e in events {
        match e {
            KvCacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            } => {
                let _ = write_map_len(w, 10);
                let _ = write_str(w, "type");
                let _ = write_str(w, "BlockStored");
                write_hashes(w, block_hashes);
                let _ = write_str(w, "parent_block_hash");
                match parent_block_hash {
                    Some(h) => drop(write_bin(w, h)),
                    None => drop(write_nil(w)),
                }
                let _ = write_str(w, "token_ids");
                let _ = write_array_len(w, token_ids.len() as u32);
                for &t in token_ids {
                    let _ = write_uint(w, t.into());
                }
                let _ = write_str(w, "block_size");
                let _ = write_uint(w, *block_size as u64);
                let _ = write_str(w, "lora_id");
                let _ = write_nil(w);
                let _ = write_str(w, "medium");
                let _ = write_str(w, MEDIUM);
                let _ = write_str(w, "lora_name");
                let _ = write_nil(w);
                // No LoRA, multimodal input or salt: one nil per block, as vLLM sends.
                let _ = write_str(w, "extra_keys");
                let _ = write_array_len(w, block_hashes.len() as u32);
                for _ in block_hashes {
                    let _ = write_nil(w);
                }
                write_group(w);
            }
            KvCacheEvent::BlockRemoved { block_hashes } => {
                let _ = write_map_len(w, 4);
                let _ = write_str(w, "type");
                let _ = write_str(w, "BlockRemoved");
                write_hashes(w, block_hashes);
                let _ = write_str(w, "medium");
                let _ = write_str(w, MEDIUM);
                write_group(w);
            }
        }
    }
    // The data-parallel rank: one engine, rank 0.
    let _ = write_uint(w, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kv_events::hash_block_tokens;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The bytes msgspec gives for the same batch built from vLLM 0.32's own classes
    /// (`KVEventBatch(ts=1.5, events=[BlockStored(...), BlockRemoved(...)],
    /// data_parallel_rank=0)`, medium "GPU", group 0, `extra_keys` as vLLM's block pool
    /// gives them for blocks without extras).
    #[test]
    fn batches_encode_as_vllm_encodes_them() {
        let none = unhex("9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
        let h1 = hash_block_tokens(none.try_into().unwrap(), &[1, 2, 3, 4]);
        let h2 = hash_block_tokens(h1, &[300, 70000, 0, 49151]);
        let events = [
            KvCacheEvent::BlockStored {
                block_hashes: vec![h1, h2],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4, 300, 70000, 0, 49151],
                block_size: 4,
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![h2],
            },
        ];
        assert_eq!(encode_batch(1.5, &events), unhex(VLLM_BATCH));
    }

    const VLLM_BATCH: &str = concat!(
        "93cb3ff8000000000000928aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368",
        "657392c42058d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111c4208f",
        "e994f50d1ea45d7712bbb96ba5fd85f8254daef990bebeb2796330d17f134bb1706172656e745f62",
        "6c6f636b5f68617368c0a9746f6b656e5f6964739801020304cd012cce0001117000cdbfffaa626c",
        "6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0",
        "aa65787472615f6b65797392c0c0a967726f75705f6964780084a474797065ac426c6f636b52656d",
        "6f766564ac626c6f636b5f68617368657391c4208fe994f50d1ea45d7712bbb96ba5fd85f8254dae",
        "f990bebeb2796330d17f134ba66d656469756da3475055a967726f75705f6964780000",
    );
}
