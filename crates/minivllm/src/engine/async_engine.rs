//! `AsyncEngine`: the `LLMEngine` on its own OS thread, driven from async code.
//!
//! A forward pass is long, CPU-bound work: running it on a tokio worker would stall every
//! connection that worker serves, so the engine owns a thread and talks over channels.

use crate::engine::structured_output_manager::StructuredOutputManager;
use crate::structured_output::backend_guidance::GrammarError;
use crate::structured_output::StructuredOutputGrammar;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::distributed::kv_transfer::KvPayload;
use crate::engine::input_processor::{CheckedParams, RequestChecks};
use crate::engine::kv_transfer::KvPuller;
use crate::engine::llm_engine::{EngineError, EngineStats, LLMEngine, PromptInput};
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::RequestOutput;
use crate::sampling_params::{RequestOutputKind, SamplingParams};

/// Why the engine thread did not take a request: the engine refused it, or the thread
/// itself could not (concerns of a served engine, not of `LLMEngine`).
#[derive(Debug, thiserror::Error)]
pub enum AsyncEngineError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(
        "the server is overloaded: {max_waiting} requests are already waiting \
         (--max-waiting-requests); retry later"
    )]
    Overloaded { max_waiting: usize },
    #[error("the engine thread has stopped")]
    Stopped,
}

type Grammar = Box<dyn StructuredOutputGrammar>;

/// A request on its way to the engine thread, with what was made for it off that thread.
type Queued = (
    NewRequest,
    Option<Grammar>,
    Option<Arc<KvPayload>>,
    mpsc::UnboundedSender<RequestOutput>,
);

enum Command {
    Add(Box<AddRequest>),
    Abort(String),
}

struct AddRequest {
    request_id: String,
    prompt: PromptInput,
    params: CheckedParams,
    /// Its structured-output constraint, compiled before it was sent.
    grammar: Option<Box<dyn StructuredOutputGrammar>>,
    /// Its prompt's KV, pulled from a prefill server before it was sent.
    kv_import: Option<Arc<KvPayload>>,
    outputs: mpsc::UnboundedSender<RequestOutput>,
    reply: oneshot::Sender<Result<(), AsyncEngineError>>,
}

/// How the engine thread admits requests.
#[derive(Debug, Clone, Default)]
pub struct AsyncEngineOptions {
    /// Refuse a request (`AsyncEngineError::Overloaded`) that would leave more than this many
    /// sequences waiting to be scheduled (see `over_limit`), so a burst costs a quick 503
    /// rather than unbounded memory and latency.
    pub max_waiting_requests: Option<usize>,
}

struct Shared {
    /// The engine thread, until someone takes it to wait for the engine's end.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stats: Mutex<EngineStats>,
    num_free_blocks: AtomicUsize,
    num_total_blocks: usize,
}

/// A handle to the engine thread; clones share it. The thread ends when the last handle drops.
/// One request for [`AsyncEngine::generate_many`], its parameters checked by
/// [`AsyncEngine::check`].
pub struct NewRequest {
    pub request_id: String,
    pub prompt: PromptInput,
    pub params: CheckedParams,
}

#[derive(Clone)]
pub struct AsyncEngine {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    tokenizer: Arc<Tokenizer>,
    structured: Arc<StructuredOutputManager>,
    checks: RequestChecks,
}

impl AsyncEngine {
    pub fn new(engine: LLMEngine) -> Self {
        Self::with_options(engine, AsyncEngineOptions::default())
    }

    pub fn with_options(engine: LLMEngine, options: AsyncEngineOptions) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            thread: Mutex::new(None),
            stats: Mutex::new(engine.stats()),
            num_free_blocks: AtomicUsize::new(engine.kv_blocks().0),
            num_total_blocks: engine.kv_blocks().1,
        });
        let tokenizer = engine.tokenizer().clone();
        let structured = Arc::clone(engine.structured_output_manager());
        let checks = engine.request_checks().clone();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("minivllm-engine".into())
            .spawn(move || engine_loop(engine, rx, &thread_shared, &options))
            .expect("cannot spawn the engine thread");
        *shared.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
        Self {
            commands,
            shared,
            tokenizer,
            structured,
            checks,
        }
    }

    /// The engine thread, to join once every handle to the engine is dropped: it then drops
    /// the engine (which, with tensor parallelism, stops the workers) and ends. `None` after
    /// the first call.
    pub fn take_thread(&self) -> Option<std::thread::JoinHandle<()>> {
        self.shared
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Queues a request; its outputs arrive on the returned receiver, of the kind
    /// `params.output_kind` asks for (the engine's output processor makes them; a server
    /// route asks for `DELTA` when it streams and `FINAL_ONLY` otherwise, as vLLM's do), the
    /// last one with `finished` set; [`collect`] folds `DELTA` ones. Dropping the receiver
    /// aborts the request within a step.
    pub async fn generate(
        &self,
        request_id: impl Into<String>,
        prompt: PromptInput,
        params: SamplingParams,
        priority: i32,
    ) -> Result<mpsc::UnboundedReceiver<RequestOutput>, AsyncEngineError> {
        let one = NewRequest {
            request_id: request_id.into(),
            prompt,
            params: self.check(params, priority)?,
        };
        let mut streams = self.generate_many(vec![one]).await?;
        Ok(streams.remove(0))
    }

    /// Queues several requests (a completion's prompts) before waiting for any to be
    /// accepted, so that they enter the engine together: awaited one by one, each would wait
    /// for the step in progress, one prompt per step. On an error, the requests already
    /// queued are aborted as their receivers drop.
    pub(crate) async fn generate_many(
        &self,
        requests: Vec<NewRequest>,
    ) -> Result<Vec<mpsc::UnboundedReceiver<RequestOutput>>, AsyncEngineError> {
        let grammars = self.compile(&requests).await?;
        // Each prompt's KV pulled side by side: a completion's prompts may come from
        // several prefills.
        let pulls = requests.iter().map(|r| async {
            match &self.checks.kv_puller {
                Some(p) => p.pull_for(&r.request_id, r.params.params()).await,
                None => Ok(None),
            }
        });
        let imports = futures_util::future::join_all(pulls).await;
        let imports = imports.into_iter().collect::<Result<Vec<_>, _>>()?;
        let mut streams = Vec::with_capacity(requests.len());
        let with = requests.into_iter().zip(grammars).zip(imports);
        let accepted = self.queue(with.map(|((r, g), kv)| {
            let (outputs, rx) = mpsc::unbounded_channel();
            streams.push(rx);
            (r, g, kv, outputs)
        }))?;
        for reply in accepted {
            reply.await.map_err(|_| AsyncEngineError::Stopped)??;
        }
        Ok(streams)
    }

    /// [`generate_many`](Self::generate_many) for callers outside async code (the Python
    /// bindings): every request's outputs go to the one `outputs` channel, each naming its
    /// request, so one thread can wait for a whole batch. Blocks until the engine has taken
    /// them all or refused one; dropping the channel's receiver aborts those still running.
    /// Must not be called from within an async runtime.
    pub fn submit_blocking(
        &self,
        requests: Vec<NewRequest>,
        outputs: &mpsc::UnboundedSender<RequestOutput>,
    ) -> Result<(), AsyncEngineError> {
        // Compiled on the engine's thread: this path has no blocking pool of its own.
        let mut with = Vec::with_capacity(requests.len());
        for r in requests {
            let pull = self.checks.kv_puller.as_ref();
            let kv = pull.map(|p| p.pull_blocking(&r.request_id, r.params.params()));
            with.push((r, None, kv.transpose()?.flatten(), outputs.clone()));
        }
        let accepted = self.queue(with.into_iter())?;
        for reply in accepted {
            reply
                .blocking_recv()
                .map_err(|_| AsyncEngineError::Stopped)??;
        }
        Ok(())
    }

    /// Each request's structured-output constraint, compiled on the blocking pool: neither
    /// the token trie's first build nor a large schema holds up the engine's steps (vLLM
    /// compiles in a pool too).
    async fn compile(
        &self,
        requests: &[NewRequest],
    ) -> Result<Vec<Option<Grammar>>, AsyncEngineError> {
        let mut grammars = Vec::with_capacity(requests.len());
        for r in requests {
            let Some(so) = &r.params.params().structured_outputs else {
                grammars.push(None);
                continue;
            };
            let (manager, so, prompt) =
                (Arc::clone(&self.structured), so.clone(), r.prompt.clone());
            let compiled = tokio::task::spawn_blocking(move || manager.compile(&so, &prompt))
                .await
                .unwrap_or_else(|e| Err(GrammarError::Invalid(format!("compiling failed: {e}"))));
            grammars.push(Some(compiled.map_err(EngineError::from)?));
        }
        Ok(grammars)
    }

    /// Sends each request to the engine thread; the receivers say whether it took them.
    fn queue(
        &self,
        requests: impl Iterator<Item = Queued>,
    ) -> Result<Vec<oneshot::Receiver<Result<(), AsyncEngineError>>>, AsyncEngineError> {
        let mut pending = Vec::with_capacity(requests.size_hint().0);
        for (r, grammar, kv_import, outputs) in requests {
            let (reply, accepted) = oneshot::channel();
            let cmd = Command::Add(Box::new(AddRequest {
                request_id: r.request_id,
                prompt: r.prompt,
                params: r.params,
                grammar,
                kv_import,
                outputs,
                reply,
            }));
            self.commands
                .send(cmd)
                .map_err(|_| AsyncEngineError::Stopped)?;
            pending.push(accepted);
        }
        Ok(pending)
    }

    pub fn abort(&self, request_id: impl Into<String>) {
        // A stopped engine has nothing left to abort.
        let _ = self.commands.send(Command::Abort(request_id.into()));
    }

    /// The counters as of the last step.
    pub fn stats(&self) -> EngineStats {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `/metrics` in Prometheus' text format, labelled with `model_name`.
    pub(crate) fn metrics_text(&self, model_name: &str) -> String {
        self.stats().render_prometheus(model_name)
    }

    pub fn num_free_blocks(&self) -> usize {
        self.shared.num_free_blocks.load(Ordering::Relaxed)
    }

    pub fn num_total_blocks(&self) -> usize {
        self.shared.num_total_blocks
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn max_model_len(&self) -> usize {
        self.checks.limits.max_model_len
    }

    pub fn max_num_seqs(&self) -> usize {
        self.checks.max_num_seqs
    }

    /// The engine's checks of a request's parameters and priority, made here (on the
    /// caller's thread) and nowhere else: the engine takes what passes as it is.
    pub fn check(
        &self,
        params: SamplingParams,
        priority: i32,
    ) -> Result<CheckedParams, EngineError> {
        self.checks.check(params, priority)
    }
}

/// A request's output so far from its stream of outputs of `kind`: `DELTA` ones folded
/// together, otherwise the last (each `CUMULATIVE` one holds everything so far, a
/// `FINAL_ONLY` request sends one). The whole output once the stream has ended with the
/// request finished; `None` when nothing came.
pub async fn collect(
    mut rx: mpsc::UnboundedReceiver<RequestOutput>,
    kind: RequestOutputKind,
) -> Option<RequestOutput> {
    let mut acc = rx.recv().await?;
    while let Some(out) = rx.recv().await {
        match kind {
            RequestOutputKind::Delta => acc.add(out),
            RequestOutputKind::Cumulative => acc = out,
            RequestOutputKind::FinalOnly => {
                debug_assert!(false, "a FINAL_ONLY request sent a second output");
                acc = out;
            }
        }
    }
    Some(acc)
}

fn engine_loop(
    mut engine: LLMEngine,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shared: &Shared,
    options: &AsyncEngineOptions,
) {
    let mut streams: HashMap<String, mpsc::UnboundedSender<RequestOutput>> = HashMap::new();
    loop {
        if !engine.has_unfinished_requests() {
            engine.release_idle_memory();
            match commands.blocking_recv() {
                Some(cmd) => handle(&mut engine, &mut streams, options, cmd),
                None => return,
            }
        }
        while let Ok(cmd) = commands.try_recv() {
            handle(&mut engine, &mut streams, options, cmd);
        }
        // A client that went away between steps should not cost another step of compute.
        streams.retain(|id, tx| {
            let open = !tx.is_closed();
            if !open {
                abort(&mut engine, id, "client disconnected");
            }
            open
        });
        if engine.has_unfinished_requests() {
            step(&mut engine, &mut streams, shared);
        }
        publish(&engine, shared);
    }
}

/// Makes the engine's counts visible to `/metrics` and `stats()`. Called after each step
/// before its outputs are sent, so that a client that has its last output never finds its
/// request still counted as running.
fn publish(engine: &LLMEngine, shared: &Shared) {
    *shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = engine.stats();
    shared
        .num_free_blocks
        .store(engine.kv_blocks().0, Ordering::Relaxed);
}

fn step(
    engine: &mut LLMEngine,
    streams: &mut HashMap<String, mpsc::UnboundedSender<RequestOutput>>,
    shared: &Shared,
) {
    match engine.step() {
        Ok(outputs) => {
            publish(engine, shared);
            let mut gone = Vec::new();
            for out in outputs {
                let id = out.request_id.clone();
                let Some(tx) = streams.get(&id) else { continue };
                let finished = out.finished;
                if finished {
                    tracing::info!(request_id = %id, "finished request");
                }
                if tx.send(out).is_err() {
                    gone.push(id);
                } else if finished {
                    streams.remove(&id);
                }
            }
            for id in gone {
                abort(engine, &id, "client disconnected");
                streams.remove(&id);
            }
        }
        Err(e) => {
            // The batch's state is unknown after a failed step: end every request
            // (closing its stream) rather than serve outputs that may be wrong.
            tracing::error!("engine step failed: {e}");
            for id in streams.keys() {
                abort(engine, id, "engine step failed");
            }
            streams.clear();
        }
    }
}

/// Whether admitting a request of `params` would leave more than `max` sequences waiting,
/// counting each waiting request as its `n` (or `best_of`) sequences. An empty queue admits any
/// request (its width is already bounded by `--max-num-seqs`).
fn over_limit(engine: &LLMEngine, params: &SamplingParams, max: usize) -> bool {
    let waiting = engine.num_waiting_sequences();
    waiting > 0 && waiting + params.num_sequences() > max
}

fn abort(engine: &mut LLMEngine, id: &str, why: &str) {
    tracing::info!(request_id = %id, reason = why, "aborted request");
    engine.abort_request(id);
}

fn handle(
    engine: &mut LLMEngine,
    streams: &mut HashMap<String, mpsc::UnboundedSender<RequestOutput>>,
    options: &AsyncEngineOptions,
    cmd: Command,
) {
    match cmd {
        Command::Add(add) => {
            let AddRequest {
                request_id,
                prompt,
                params,
                grammar,
                kv_import,
                outputs,
                reply,
            } = *add;
            let result = match options.max_waiting_requests {
                Some(max) if over_limit(engine, params.params(), max) => {
                    Err(AsyncEngineError::Overloaded { max_waiting: max })
                }
                _ => engine
                    .prepare_request(prompt, params, grammar)
                    .and_then(|mut r| {
                        let puller = engine.request_checks().kv_puller.as_ref();
                        r.kv_import = KvPuller::checked(puller, kv_import, &r.prompt.token_ids)?;
                        Ok(r)
                    })
                    .and_then(|r| engine.add_prepared_request(request_id.clone(), r))
                    .map_err(AsyncEngineError::from),
            };
            match &result {
                Ok(()) => {
                    tracing::info!(request_id = %request_id, "added request");
                    streams.insert(request_id.clone(), outputs);
                }
                Err(e) => tracing::info!(request_id = %request_id, "refused request: {e}"),
            }
            if reply.send(result).is_err() {
                // The caller gave up while the request was being queued.
                abort(engine, &request_id, "client gave up");
                streams.remove(&request_id);
            }
        }
        Command::Abort(id) => {
            abort(engine, &id, "abort requested");
            streams.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::llm_engine::EngineArgs;
    use std::time::{Duration, Instant};

    fn engine() -> AsyncEngine {
        let args = EngineArgs {
            model: crate::testing::test_model_path().display().to_string(),
            kv_cache_memory: 64 << 20,
            max_model_len: Some(1024),
            ..EngineArgs::default()
        };
        AsyncEngine::new(LLMEngine::from_engine_args(&args).unwrap())
    }

    fn params(max_tokens: usize) -> SamplingParams {
        SamplingParams {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..SamplingParams::greedy()
        }
    }

    async fn last(rx: mpsc::UnboundedReceiver<RequestOutput>) -> RequestOutput {
        collect(rx, RequestOutputKind::Cumulative)
            .await
            .expect("no output")
    }

    #[tokio::test]
    async fn concurrent_requests_complete_and_errors_stay_local() {
        let engine = engine();
        let a = engine
            .generate("a", "The capital of France is".into(), params(8), 0)
            .await
            .unwrap();
        let b = engine
            .generate("b", "Once upon a time".into(), params(5), 0)
            .await
            .unwrap();
        let bad = SamplingParams {
            temperature: -1.0,
            ..params(4)
        };
        let err = engine.generate("c", "Hi".into(), bad, 0).await;
        assert!(matches!(
            err,
            Err(AsyncEngineError::Engine(EngineError::Validation(_)))
        ));
        let (a, b) = tokio::join!(last(a), last(b));
        assert!(a.finished && b.finished);
        assert_eq!(a.outputs[0].token_ids.len(), 8);
        assert_eq!(b.outputs[0].token_ids.len(), 5);
        assert!(
            a.outputs[0].text.starts_with(" Paris"),
            "{:?}",
            a.outputs[0].text
        );
    }

    #[tokio::test]
    async fn requests_queued_together_share_steps() {
        let engine = engine();
        let before = engine.stats().num_steps;
        let requests = (0..32)
            .map(|i| NewRequest {
                request_id: format!("r{i}"),
                prompt: format!("Prompt number {i} is").into(),
                params: engine.check(params(1), 0).unwrap(),
            })
            .collect();
        let streams = engine.generate_many(requests).await.unwrap();
        for rx in streams {
            assert!(last(rx).await.finished);
        }
        // One at a time they took a step each; queued together, one or two steps in all.
        let steps = engine.stats().num_steps - before;
        assert!(steps <= 2, "32 one-token requests took {steps} steps");
    }

    /// `submit_blocking` from plain threads: one channel for a batch, final outputs only,
    /// the same tokens as a streamed request; a refused request names its fault, and
    /// dropping the receiver frees what is still running.
    #[test]
    fn submitted_batches_send_their_final_outputs_to_one_channel() {
        let engine = engine();
        let total = engine.num_total_blocks();
        let final_only = |max_tokens| SamplingParams {
            output_kind: RequestOutputKind::FinalOnly,
            ..params(max_tokens)
        };
        let request = |id: &str, max_tokens| NewRequest {
            request_id: id.into(),
            prompt: "The capital of France is".into(),
            params: engine.check(final_only(max_tokens), 0).unwrap(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        engine
            .submit_blocking(vec![request("a", 6), request("b", 3)], &tx)
            .unwrap();
        let mut outs: Vec<RequestOutput> = (0..2).map(|_| rx.blocking_recv().unwrap()).collect();
        assert!(rx.try_recv().is_err(), "only final outputs are sent");
        outs.sort_by(|x, y| x.request_id.cmp(&y.request_id));
        assert!(outs.iter().all(|o| o.finished));
        assert_eq!(outs[0].outputs[0].token_ids.len(), 6);
        assert_eq!(
            outs[0].outputs[0].token_ids[..3],
            outs[1].outputs[0].token_ids
        );

        let bad = SamplingParams {
            top_p: 0.0,
            ..final_only(3)
        };
        assert!(matches!(
            engine.check(bad, 0),
            Err(EngineError::Validation(_))
        ));
        let refused = engine.submit_blocking(vec![request("d", 400), request("d", 3)], &tx);
        assert!(matches!(
            refused,
            Err(AsyncEngineError::Engine(EngineError::DuplicateRequest(_)))
        ));
        drop((tx, rx));
        let deadline = Instant::now() + Duration::from_secs(30);
        while engine.num_free_blocks() != total || engine.stats().num_running != 0 {
            assert!(
                Instant::now() < deadline,
                "the dropped batch was not aborted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A request of `n` completions counts as its sequences against `max_waiting_requests`.
    #[tokio::test]
    async fn waiting_siblings_count_against_the_queue_limit() {
        let args = EngineArgs {
            model: crate::testing::test_model_path().display().to_string(),
            kv_cache_memory: 64 << 20,
            max_model_len: Some(1024),
            max_num_seqs: 3,
            ..EngineArgs::default()
        };
        let options = AsyncEngineOptions {
            max_waiting_requests: Some(4),
        };
        let engine =
            AsyncEngine::with_options(LLMEngine::from_engine_args(&args).unwrap(), options);
        let forks = |max_tokens| SamplingParams {
            n: 3,
            temperature: 1.0,
            seed: Some(1),
            ..params(max_tokens)
        };
        // Three sequences run; a second request of three waits, counting 3 of the 4.
        let mut running = engine
            .generate("a", "Hi".into(), forks(300), 0)
            .await
            .unwrap();
        running.recv().await.unwrap();
        let _waiting = engine
            .generate("b", "Hi".into(), forks(4), 0)
            .await
            .unwrap();
        let _one_more = engine
            .generate("c", "Hi".into(), params(4), 0)
            .await
            .unwrap();
        let refused = engine.generate("d", "Hi".into(), params(4), 0).await;
        assert!(
            matches!(
                refused,
                Err(AsyncEngineError::Overloaded { max_waiting: 4 })
            ),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn dropped_receiver_frees_blocks() {
        let engine = engine();
        let total = engine.num_total_blocks();
        let mut rx = engine
            .generate("long", "Tell me a story.".into(), params(400), 0)
            .await
            .unwrap();
        rx.recv().await.unwrap();
        drop(rx);
        let deadline = Instant::now() + Duration::from_secs(30);
        while engine.num_free_blocks() != total || engine.stats().num_running != 0 {
            assert!(Instant::now() < deadline, "blocks were not freed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
