"""The one declared shape of every job config (ml_collections). Config files in `configs/`
start from `base_config()` and override fields; a field not declared here is an error, so a
typo such as `--config.run.max_new_token=8` fails instead of being ignored."""

from __future__ import annotations

import functools

import ml_collections

JOBS = ("generate", "perplexity", "quality", "eval", "record_traces", "replay", "curve", "plan",
        "train")


@functools.cache
def declared_defaults() -> ml_collections.ConfigDict:
    """`base_config()` built once per process, to read and never to change: what the checks
    compare a config against (a sweep checks each cell at its launch and again when it runs;
    building the schema was about 2 ms of each check). Locked: a field added to it fails."""
    schema = base_config()
    schema.lock()
    return schema


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.job = "generate"
    c.seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.checkpoint = ""  # a converted moejax checkpoint directory
    # Without a checkpoint: "embedded" is the small MoE moejax trained and ships (OLMoE family,
    # byte-level); any other name is a preset of `family` with random weights drawn from `seed`.
    c.model.preset = "embedded"
    c.model.family = "olmoe"
    c.model.gmm_impl = "tiled"  # grouped matmul: "tiled" or "ragged_dot"
    c.model.lookahead = 2  # MoE layers ahead whose gates score this layer's hidden state
    # A family preset at another width (random weights): 0 keeps the preset's; N keeps its
    # depth, expert count and top-k and sets the hidden and expert widths to N, so a CPU runs
    # a real model's routing structure (with `policies.routing='trace(path=T)'`).
    c.model.width = 0
    # How gate outputs reach the host: "returned" by the router step, or delivered from inside
    # it by an io_callback (SpecMD's gate hook). benchmarks/cache_runtime.py (part 4) compares
    # them.
    c.model.gate_path = "returned"
    # The plan job's model as a Hugging Face config.json (no weights: the planner reads the
    # dimensions only); "" (not given): model.checkpoint, or model.family / model.preset.
    c.model.hf_config = ""

    # The expert cache. With cache.enabled=False every expert is on the device.
    c.cache = ml_collections.ConfigDict()
    c.cache.enabled = True
    c.cache.capacity_frac = 0.05  # of `capacity_of`'s bytes; not with cache.slots > 0 (both: an error)
    # What capacity_frac is a fraction of: "experts" (all routed experts' native bytes) or
    # "model" (the whole model's native bytes, dense weights included: SpecMD's meaning).
    c.cache.capacity_of = "experts"
    # An absolute slot count, 1 to the routed experts (overrides capacity_frac; one precision
    # pool only); 0 (not given): capacity_frac sizes the cache.
    c.cache.slots = 0
    # The precision a plain fetch and a prefetch move: native, int8, int4, int2; "" (not
    # given): native, or the first of a precision-aware miss policy's levels. Several levels
    # (fetch_priority, ...) get one slot pool each, sharing the byte budget
    # (moejax/cache/capacity.py).
    c.cache.precision = ""
    # Byte shares of those pools: "" (equal) or e.g. "int8=0.5,int4=0.3,int2=0.2" (sum 1).
    c.cache.precision_shares = ""
    # Quantization group length, used only to compute a quantized expert's bytes from a model
    # preset (replay without a checkpoint); live runs take the checkpoint's.
    c.cache.group_size = 64
    # Floor on the slot count. Tiny-scale configs set it to top-k so that 1% of a 256-expert
    # model stays runnable; below top-k without a floor is an error (DESIGN.md, capacity).
    c.cache.min_slots = 0
    # What a demand fetch may not evict: "layer" (the running layer's experts, resident
    # together for the grouped matmul; live runs need it) or "request" (only the expert being
    # fetched: SpecMD's expert-at-a-time execution, the classic cache model; replay only).
    c.cache.pin_scope = "layer"
    # How prefetch predictions become transfers: "immediate" (each prediction takes a slot and
    # books its transfer when made), "watchdog" (SpecMD's: predictions wait in a queue; a
    # watchdog issues one as soon as a slot can be had under the eviction policy, its transfer
    # queued on the copy engines; it drops one once its target layer has started, and demand
    # misses go ahead of those not issued) or "watchdog_idle" (the same, with a stricter
    # reading, a named variant: a transfer is issued only onto an idle copy engine).
    c.cache.prefetch_queue = "immediate"
    # A staging share for prefetches (moejax/cache/staging.py; from nunspark's staging
    # buffer): that share of the slots (floor, at least one) holds prefetched experts only, and
    # a prefetch never evicts an expert a demand fetch brought in; the rest is the demand
    # share. 0: none, every slot open to both (the default, SpecMD's cache). Reference engine.
    c.cache.prefetch_share = 0.0
    # A prefetched expert's first use: "promote" (it joins the demand share, which evicts its
    # own victim when full) or "stay" (it stays staged until a prefetch evicts it; a variant).
    c.cache.prefetch_share_use = "promote"
    # Replay of traces that do not record expert sizes (capture / vLLM logs): bytes per expert
    # (0: from the trace or model.preset; unknown sizes still give exact counts).
    c.cache.expert_bytes = 0
    # The disk tier (moejax/cache/host_tier.py, DESIGN.md "The disk tier"): below 1.0 the
    # experts stay on storage and host memory holds at most this fraction of all routed
    # experts (at the plain precision), read on demand and ahead of prefetches; 1.0: every
    # expert is read into host memory at start and storage is never read again.
    c.cache.host_capacity_frac = 1.0
    c.cache.host_bytes = 0  # the host tier's size in bytes instead (0: host_capacity_frac)
    c.cache.host_eviction = "lru"  # the host tier's eviction policy (the same registry)
    # Seeding before the first token: "" (none) or "hotlist(trace=PATH, top=N)" (ds4): the
    # hottest experts of a trace (or of a run's work directory with its trace.npz) fill the
    # device and host tiers, and enter a `priority` eviction policy as priorities 1..32.
    c.cache.seed = ""
    # Experts loaded before the first token without priorities: "none" (SpecMD's
    # cold start, the default), "all" (every expert that fits: all at 100% capacity, else an
    # equal share of each layer) or "hotlist(trace=PATH, top=N)" (a trace's hottest).
    c.cache.warm_start = "none"
    # ds4's full-layer placement: every expert of the first N MoE layers resident in slots of
    # their own for the whole run; the other layers share the rest.
    c.cache.full_layers = 0
    # How a live slot load moves an expert (moejax/serving/slot_pool.py): "fused" (one
    # compiled step slices the host table, moves and writes the slot), "copy_stream"
    # (`jax.device_put` from pinned_host on the transfer stream, then a placement step), or
    # "auto" (copy_stream on an accelerator, fused on the CPU backend).
    c.cache.load_path = "auto"
    # Speculative passes (moejax/serving/runtime.py): a decode pass may run every layer on the
    # residency it finds and decide after it, re-running from the first layer whose decision
    # would read other slots (or, on the wall clock, read an expert still in flight); on the
    # virtual clock the numbers are those of deciding layer by layer (tested), only the wall
    # time changes. False: decide layer by layer.
    c.cache.speculate = True
    # On the CPU backend and the virtual clock, a speculative step reads an expert that is not
    # resident yet from its host copy (the bytes its load copies into a slot), so a miss, an
    # eviction or a prefetch fails no check (DESIGN "Speculative passes"). False: such a step
    # reads a slot, and its check fails. Elsewhere (an accelerator, the wall clock, the disk
    # tier, copy_stream) it does not apply.
    c.cache.speculate_from_host = True
    # Fiddler / llama.cpp --n-cpu-moe: the experts of the first N MoE layers are always
    # computed on the host, never loaded into a slot.
    c.cache.host_compute_layers = 0

    # The storage the disk tier reads (moejax/timing/storage.py): a preset, each field
    # overridable (None keeps the preset's). Without a host tier no storage is read: a field
    # given then is said not to apply (a warning), as is io.* there and in a replay.
    c.storage = ml_collections.ConfigDict()
    c.storage.preset = "nvme_gen4"  # nvme_gen4, sata_ssd, hdd (moejax/timing/storage.py)
    c.storage.read_gbps = ml_collections.config_dict.placeholder(float)
    c.storage.read_latency_s = ml_collections.config_dict.placeholder(float)
    c.storage.queue_depth = ml_collections.config_dict.placeholder(int)
    # How the live runtime reads an expert (moejax/checkpoint/expert_reader.py): `split`
    # page-aligned range reads of a packed checkpoint's expert record (1..8, Anemll's
    # --cache-io-split) over `workers` persistent reader threads; `mode` "pread" (reads into
    # the tier's buffers), "mmap" (the layer files mapped, pages through the page cache) or
    # "direct" (pread with O_DIRECT into page-aligned buffers: every read from the device).
    c.io = ml_collections.ConfigDict()
    c.io.split = 1
    c.io.workers = 8
    c.io.mode = "pread"

    c.policies = ml_collections.ConfigDict()
    # Policy specs; "" (not given) takes the preset's spec, or with no preset the default
    # combination, SpecMD's recommended one (Table 2, #5): least_stale, score_percentile(p=80),
    # fetch, standard (moejax/policies/presets.py: DEFAULTS). A given field always wins over
    # the preset's. presets.resolve(config.policies) is the four specs that run.
    c.policies.eviction = ""  # lru, lru_per_layer, lfu, fld, score, least_stale, ...
    c.policies.prefetch = ""  # none, topk(overfetch=1.0, lookahead=1), score_percentile(p=80), ...
    # fetch, drop(keep=2), substitute(tol=0.05), host_compute, latency_aware(admit_after=0)
    c.policies.miss = ""
    c.policies.routing = ""  # standard, cache_aware(lam=0.3)
    # A named combination (SpecMD Table 2, specmd_1..specmd_5): fills the fields not given, so
    # `preset=specmd_1 eviction=least_stale` is specmd_1 with Least-Stale eviction.
    c.policies.preset = ""
    # Policies of the user's own: paths to .py files or importable module names, comma-separated,
    # imported before any spec is resolved (moejax/policies/user_modules.py); results.json's
    # `policy_modules` keeps each one's path and SHA-256.
    c.policies.modules = ""

    c.hardware = ml_collections.ConfigDict()
    c.hardware.preset = "a100_specmd"  # a100_specmd, h100_pcie, h200, cpu
    # A hardware.json written by `python -m moejax.calibration --workdir=W`: its measured
    # profile replaces the preset's (the overrides below still apply). "" (not given): preset.
    c.hardware.file = ""
    # Overrides of the preset (moejax/timing/hardware.py): None (not given) keeps the preset's
    # value; any given value replaces it, 0 included (`--config.hardware.h2d_latency_s=0`).
    # Bandwidths are finite and > 0, latencies finite and >= 0.
    c.hardware.h2d_gbps = ml_collections.config_dict.placeholder(float)  # per copy engine, GB/s
    c.hardware.h2d_latency_s = ml_collections.config_dict.placeholder(float)  # per transfer, s
    c.hardware.copy_engines = ml_collections.config_dict.placeholder(int)
    # The host link all copy engines share, GB/s (the preset's: h2d_gbps, one engine's worth).
    c.hardware.link_gbps = ml_collections.config_dict.placeholder(float)
    c.hardware.peak_tflops = ml_collections.config_dict.placeholder(float)
    c.hardware.hbm_gbps = ml_collections.config_dict.placeholder(float)
    c.hardware.launch_s = ml_collections.config_dict.placeholder(float)

    # The host CPU that computes missed experts (`policies.miss=host_compute|latency_aware`,
    # `cache.host_compute_layers`; moejax/timing/host.py): a preset, each field overridable
    # (None keeps the preset's), or the host part of `hardware.file`.
    c.host = ml_collections.ConfigDict()
    c.host.preset = "desktop_ddr5"
    c.host.mem_gbps = ml_collections.config_dict.placeholder(float)  # memory bandwidth, GB/s
    c.host.tflops = ml_collections.config_dict.placeholder(float)  # matmul peak, TFLOP/s
    c.host.threads = ml_collections.config_dict.placeholder(int)
    c.host.call_overhead_s = ml_collections.config_dict.placeholder(float)  # per host call
    # Activations moved device->host and back per host call, GB/s each way (None: the link's).
    c.host.d2h_gbps = ml_collections.config_dict.placeholder(float)

    c.clock = ml_collections.ConfigDict()
    c.clock.kind = "auto"  # auto (virtual off-GPU, wall on GPU), virtual, wall
    # Where hardware.file has the host's work (`host_work`, written by `python -m
    # moejax.calibration.calibrate`), the virtual clock charges it: the live runtime's steps, gate
    # round trips and decisions (moejax/cache/runtime_timing.py). False: the device-only model.
    c.clock.host_work = True

    c.run = ml_collections.ConfigDict()
    c.run.prompt = "The Python interpreter"
    # Comma-separated token ids, used instead of `prompt` when set (checkpoints without a
    # tokenizer, or exact prompts for comparisons).
    c.run.prompt_ids = ""
    # Several prompts, each one request, run one after another through the same expert cache
    # (a fresh sequence each, greedy `max_new_tokens` each): TTFT of the first request is cold,
    # of the later ones warm. When given, `prompt` is ignored; not with `prompt_ids`. From the
    # shell a Python list literal, `--config.run.prompts='["The Python interpreter", "def
    # main():"]'`, or the flag repeated with each prompt quoted inside:
    # `--config.run.prompts='"def main():"' --config.run.prompts='"import os"'`.
    c.run.prompts = ()
    c.run.max_new_tokens = 32
    c.run.batch_size = 1
    c.run.stop_at_eos = True
    # Run the prefill of each distinct prompt length and one decode step once before the timed
    # run, so TTFT (of every request) and tok/s measure execution rather than XLA compilation.
    c.run.warmup = True
    # A workdir that holds an earlier run's results.json is refused (nothing a user had is
    # overwritten); True moves the earlier run's files aside, into W/previous/<time>/.
    c.run.overwrite = False

    c.log = ml_collections.ConfigDict()
    c.log.progress = True  # a progress bar over decode steps (replay: over passes)
    c.log.tensorboard = True  # TensorBoard events in the workdir (grids turn this off)

    # The perplexity job (configs/perplexity.py): bits per byte of the model on `text_file`, in
    # windows of `window` tokens advanced by `stride` (each token scored once, with >=
    # window-stride context).
    c.perplexity = ml_collections.ConfigDict()
    c.perplexity.text_file = ""
    c.perplexity.window = 256
    c.perplexity.stride = 128
    c.perplexity.max_tokens = 0  # score at most this many tokens of the file (0: all)

    c.eval = ml_collections.ConfigDict()
    # The eval job's heldout task: bits per byte of each held-out text in windows of `window`
    # tokens advanced by `stride`, at most `max_tokens` tokens of each (0: all).
    c.eval.window = 256
    c.eval.stride = 128
    c.eval.max_tokens = 0
    # The eval job (configs/eval.py; seqio tasks in moejax/eval/, the `eval` extra): a task
    # generated (or scored) through the configured cache. Tasks: gsm8k (the split moejax
    # ships), heldout (bits per byte of the held-out texts), jsonl, truthfulqa_mc, nq_open
    # (the last three read `eval.data_file`, a local JSONL; gsm8k reads one of its own format
    # instead of the shipped split when given). heldout also takes window, stride, max_tokens.
    c.eval.task = ""
    c.eval.data_file = ""
    c.eval.max_examples = 0  # the first N examples (0: all)
    # Few-shot exemplars before each prompt (generation tasks: gsm8k, jsonl, nq_open): the
    # first `shots` examples, taken out of the evaluated ones.
    c.eval.shots = 0
    c.eval.max_new_tokens = 256  # greedy tokens per generated answer
    # The fields of an eval.task=jsonl file's objects holding the prompt and the reference.
    c.eval.input_field = "input"
    c.eval.target_field = "target"
    # Generation stops at the first of these strings (the answer is cut there), replacing the
    # task's own (gsm8k: "\n\n" and "Question:"; nq_open, jsonl: "\n"); () keeps the task's.
    # From the shell a Python list literal: --config.eval.stop='["\n\n", "###"]'.
    c.eval.stop = ()

    # The quality job (configs/quality.py): the configured cache against the reference (the
    # same model, every expert resident at native precision), teacher-forced on the same
    # tokens of `text_file` (or of `eval.task`'s examples), then greedy drift.
    c.quality = ml_collections.ConfigDict()
    c.quality.text_file = ""  # the text (one of it and eval.task)
    # "decode": one token per forward, as a served model consumes generated tokens (the cache
    # sees decode traffic); "prefill": each segment in one forward (faster; prefill traffic).
    c.quality.teacher_forcing = "decode"
    c.quality.segment_tokens = 256  # each segment a fresh sequence; its first token unscored
    c.quality.max_tokens = 512  # tokens of the text taken (0: all)
    # Greedy drift: `drift_prompts` prompts of `drift_prompt_tokens` tokens, spread over the
    # text, each continued `drift_new_tokens` tokens by both models (prefill + decode, served
    # as the generate job serves them: the speed of the cell comes from these requests).
    c.quality.drift_prompts = 4
    c.quality.drift_prompt_tokens = 32
    c.quality.drift_new_tokens = 32

    # Routing traces (moejax/traces/format.py). `tracing.record` makes the generate job write
    # WORKDIR/trace.npz; the record_traces job writes one trace per held-out prompt and domain.
    c.tracing = ml_collections.ConfigDict()
    c.tracing.record = False
    c.tracing.prompts_per_domain = 2
    c.tracing.prompt_tokens = 64
    c.tracing.teacher_forced = True  # decode steps consume the held-out text, not the argmax

    # The replay job (configs/replay.py): a trace file (moejax .npz, capture JSONL or vLLM rows
    # JSONL) replayed through the cache instead of running a model. A trace-driven generate run
    # (`policies.routing='trace(path=T)'`) reads T with num_experts, strict, request_tokens and
    # prefill_tokens too.
    c.replay = ml_collections.ConfigDict()
    c.replay.trace = ""
    # The model's expert count for traces that do not state it (a capture header with
    # "n_experts": null, vLLM logs); 0: the trace's own count, else the largest id + 1
    # (results.json's trace.num_experts_source says which). Must agree with a stated count.
    c.replay.num_experts = 0
    # Incomplete trailing tokens of a vLLM log (rows of some layers missing) are errors
    # instead of skipped with a warning (moejax/traces/importers.py).
    c.replay.strict = False
    # Replay a batch-1 sequence as consecutive requests of this many token rows (0: one
    # request), each starting with a prefill pass of its first `prefill_tokens` rows (0 with
    # 0: the passes as recorded). A token routes the same inside a prefill as in a decode
    # step, so this gives decode-only captures a TTFT, and several requests a warm TTFT
    # (moejax/traces/requests.py says what it does not reproduce).
    c.replay.request_tokens = 0
    c.replay.prefill_tokens = 0
    # Replay's engine (moejax/replay/compiled.py): "auto" runs what the compiled engine
    # covers (the evictions lru, fifo, lru_per_layer, lfu, fld, least_stale, belady; any
    # prefetcher, both queues, waves; fetch, standard routing, one pool, no host tier or
    # placement) on it, counter for counter what "reference" (the policy objects, request by
    # request) gives, and everything else on the reference.
    c.replay.engine = "auto"

    # The curve job (configs/curve.py, moejax/jobs/curve.py): the replay's trace and every
    # replay setting above (and the cache's, the policies', the clock's) at every cache size, in
    # slots from top-k up; each eviction's hits, late hits, misses and collision misses per
    # size, from stack distances where they are exact in moejax's semantics (lru; docs/DESIGN.md
    # "Capacity curves in one pass"), else by the replay engine at each size.
    c.curve = ml_collections.ConfigDict()
    # The eviction policies, each a curve (policies.eviction is not read), comma-separated.
    c.curve.policies = "lru,lru_per_layer"
    # The largest size, in slots; 0: where nothing more is gained (every distinct expert the
    # trace asks for resident at once; with a prefetcher, seeding or another routing: every
    # expert).
    c.curve.max_slots = 0
    # Sizes of each curve replayed again, independently, and compared (the run is refused
    # when one differs): the smallest stack-distance size, the largest, then drawn by `seed`.
    c.curve.checks = 5

    # The plan job (configs/plan.py, moejax/jobs/plan.py): for the model on the machine
    # (hardware.*, host.*, storage.*) and the workload (replay.trace; without one, the shipped
    # captures of the model's family), which cache configuration to run and how fast it will
    # be: each candidate replayed on the virtual clock, ranked, the best recommended as a
    # command line (docs/DESIGN.md "The planner").
    c.plan = ml_collections.ConfigDict()
    # The device memory the expert slots may take, decimal GB (> 0). Read as `budget_of` says.
    c.plan.device_gb = 0.0
    # "experts": device_gb is the expert slots' budget, the dense weights and the KV cache
    # counted beside it; "device": device_gb is the whole device, the slots get what the dense
    # weights and the KV cache leave.
    c.plan.budget_of = "experts"
    c.plan.context = 4096  # tokens of KV cache counted for one sequence
    # Host memory for experts, decimal GB: 0 (not given) holds every expert; less than the
    # experts take needs the disk tier (cache.host_bytes), if `disk` allows it.
    c.plan.host_gb = 0.0
    c.plan.disk = True
    # Constraints: native precision only (moejax has no lossless compression), or a quality
    # floor, the lowest precision a candidate may move experts at (native, int8, int4, int2).
    c.plan.lossless = False
    c.plan.min_precision = "int4"
    # What the ranking maximises: "decode" (tok/s), "ttft" (its inverse), or "mix":
    # decode_weight x decode / best decode + (1 - decode_weight) x best TTFT / TTFT.
    c.plan.objective = "decode"
    c.plan.decode_weight = 0.5
    # Candidates kept after each stage of the search for the next stage to vary.
    c.plan.keep = 2
    # A candidate within this share of the best objective that takes fewer device bytes is
    # recommended instead (the knee's saving); 0: the best, whatever it takes.
    c.plan.tolerance = 0.01
    # Run the recommended configuration live (trace-driven at model.width) and compare the
    # measured decode with the band of the virtual clock's forecast of that run.
    c.plan.verify = False
    c.plan.verify_tokens = 48
    c.plan.verify_reps = 3

    c.profile = ml_collections.ConfigDict()
    c.profile.enabled = False

    # The train job (configs/train_small.py, moejax/train/loop.py): trains the embedded small
    # MoE (OLMoE family, byte-level) on prose, code and math with AdamW (`learning_rate`
    # warmed up over `warmup_steps`, cosine-decayed to `final_lr_frac` of it), Orbax
    # checkpoints every `checkpoint_every` steps (a re-run resumes from the latest), and
    # exports the final model in the moejax checkpoint layout. The defaults are the full run
    # the embedded model shipped from (about 30 minutes on 2 CPU cores).
    c.train = ml_collections.ConfigDict()
    c.train.steps = 900
    c.train.batch_size = 16
    c.train.seq_len = 256  # tokens (bytes) per row; at most model.max_position_embeddings
    c.train.learning_rate = 3e-3
    c.train.warmup_steps = 40
    c.train.final_lr_frac = 0.1
    c.train.weight_decay = 0.01
    c.train.grad_clip = 1.0  # global-norm clip
    c.train.aux_loss_coef = 0.01  # the load-balance loss's weight
    c.train.z_loss_coef = 0.001  # the router z-loss's weight
    # The trained model's shape (OLMoE family, 256-byte vocabulary).
    c.train.model = ml_collections.ConfigDict()
    c.train.model.hidden_size = 96
    c.train.model.num_layers = 8
    c.train.model.num_heads = 3
    c.train.model.num_kv_heads = 3
    c.train.model.num_experts = 32
    c.train.model.top_k = 4
    c.train.model.expert_intermediate_size = 48
    c.train.model.max_position_embeddings = 1024
    # The math domain's GSM8K file ("": the split moejax ships, moejax.bundled.GSM8K).
    c.train.gsm8k_path = ""
    c.train.log_every = 10  # steps between logged (and printed) training scalars
    c.train.eval_every = 100  # steps between held-out evaluations
    c.train.eval_batches = 4  # batches per held-out evaluation and domain
    c.train.checkpoint_every = 50
    # The export's dtype (float32 or bfloat16) and expert-chunk compression ("": none);
    # blosc-compressed chunks keep the shipped model under 12 MB.
    c.train.export_dtype = "bfloat16"
    c.train.export_compression = "blosc"
    return c


# The model fields of the train job (`train.model.*`; before, the train config's `model.*`).
TRAIN_MODEL_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "num_experts",
                      "top_k", "expert_intermediate_size", "max_position_embeddings")

# Fields that moved into their job's section: the old name -> the new one. The old name is
# declared no more, so wherever it is set (a config file, a grid, a sweep cell, the command
# line) the run is refused in one line naming the new field (`declared.moved_to`).
MOVED = {
    "trace": "replay.trace",
    "trace_num_experts": "replay.num_experts",
    "trace_strict": "replay.strict",
    "trace_request_tokens": "replay.request_tokens",
    "trace_prefill_tokens": "replay.prefill_tokens",
    "cache.replay_engine": "replay.engine",
    "text_file": ("perplexity.text_file (the perplexity job) or quality.text_file (the quality "
                  "job)"),
    **{f"model.{k}": f"train.model.{k}" for k in TRAIN_MODEL_FIELDS},
    "data.gsm8k_path": "train.gsm8k_path",
    "log.every": "train.log_every",
    "log.eval_every": "train.eval_every",
    "log.eval_batches": "train.eval_batches",
    "log.checkpoint_every": "train.checkpoint_every",
    "export.dtype": "train.export_dtype",
    "export.compression": "train.export_compression",
}

# Fields still declared (another job reads them) that a job reads under its own section now:
# job -> {the field it used to read: the one it reads}. Given (away from the default) to that
# job, the run is refused naming its field (`check`), not run on the default.
MOVED_FOR_JOB = {
    "perplexity": {"eval.window": "perplexity.window", "eval.stride": "perplexity.stride",
                   "eval.max_tokens": "perplexity.max_tokens"},
}


# Which jobs read each field (or section: its name with a trailing dot). A field not named
# here is read by every job of this schema that runs the model or a replay (the cache, the
# policies, the clocks, ...; `moejax/jobs/unapplied.py` says which of those a setting of
# the rest of the config leaves unread), and not by the train job, which reads its own section
# and `seed` (`EVERY_JOB`: the fields every job reads). A field given (away from its default) to a job that
# does not read it is said in one warning line and kept in results.json's `warnings`
# (`moejax/jobs/declared.py: unread_by_job`): accepted and ignored is never silent.
LIVE = ("generate", "perplexity", "quality", "eval", "record_traces")
# The jobs that replay a trace instead of running the model.
REPLAYS = ("replay", "curve", "plan")
EVERY_JOB = ("job", "seed")
READ_BY = (
    ("model.checkpoint", LIVE), ("model.gmm_impl", LIVE), ("model.lookahead", LIVE),
    ("model.gate_path", LIVE),
    ("run.prompt", ("generate",)), ("run.prompt_ids", ("generate",)),
    ("run.prompts", ("generate",)), ("run.batch_size", ("generate",)),
    ("run.stop_at_eos", ("generate",)), ("run.warmup", ("generate",)),
    ("run.max_new_tokens", ("generate", "record_traces")),
    ("perplexity.", ("perplexity",)),
    ("eval.window", ("eval",)), ("eval.stride", ("eval",)), ("eval.max_tokens", ("eval",)),
    ("eval.task", ("eval", "quality")), ("eval.data_file", ("eval", "quality")),
    ("eval.max_examples", ("eval", "quality")), ("eval.input_field", ("eval", "quality")),
    ("eval.target_field", ("eval", "quality")),
    ("eval.shots", ("eval",)), ("eval.max_new_tokens", ("eval",)), ("eval.stop", ("eval",)),
    ("quality.", ("quality",)),
    ("tracing.record", ("generate",)),
    ("tracing.prompts_per_domain", ("record_traces",)),
    ("tracing.prompt_tokens", ("record_traces",)),
    ("tracing.teacher_forced", ("record_traces",)),
    ("replay.", ("replay", "curve", "plan")),
    ("curve.", ("curve",)),
    ("plan.", ("plan",)), ("model.hf_config", ("plan",)),
    # The curve job sizes each cache itself and takes its evictions from curve.policies; the
    # plan job sizes each cache from plan.device_gb (an eviction given holds its search to it).
    ("cache.slots", (*LIVE, "replay")), ("cache.capacity_frac", (*LIVE, "replay")),
    ("cache.capacity_of", (*LIVE, "replay")), ("cache.min_slots", (*LIVE, "replay")),
    ("policies.eviction", (*LIVE, "replay", "plan")), ("log.tensorboard", (*LIVE, "replay")),
    ("profile.", ("generate",)),
    ("train.", ("train",)),
)
# A trace-driven generate run (`policies.routing='trace(path=T)'`, moejax/traces/driven.py)
# reads T as the replay job reads its trace: these fields of the replay section too.
TRACE_DRIVEN_READS = ("replay.num_experts", "replay.strict", "replay.request_tokens",
                      "replay.prefill_tokens")


# Fields a results.json `config` written before fields moved (`MOVED`) had under no name: a
# schema config had no train section, nor the perplexity job's window outside `eval`.
_NEW_FIELDS = ("train.", "perplexity.window", "perplexity.stride", "perplexity.max_tokens",
               "curve.", "plan.", "model.hf_config")
_TEXT_FILES = {"quality": "quality.text_file", "perplexity": "perplexity.text_file"}
# Sections declared since results.json configs were written without them: such a config had
# their fields at the defaults (the curve and plan jobs' sections; no earlier job read them).
_ADDED_SECTIONS = ("curve", "plan")
# Fields declared since in a section such configs have: at their defaults there.
_ADDED_FIELDS = ("model.hf_config",)


def current_config(config: dict) -> dict:
    """A results.json `config` (a nested dict) as this schema names its fields: one written
    before fields moved into their job's section (`MOVED`, `MOVED_FOR_JOB`; sweeps on disk)
    has them under their new names (its `text_file` is `quality.text_file` for the quality job,
    else `perplexity.text_file`, the other one empty) and the fields it had under no name
    (`_NEW_FIELDS`) at their defaults, so that it compares field for field with a config
    written now; a field it lacks under its old name stays absent. A config written before a
    section was declared (`_ADDED_SECTIONS`) gets it at its defaults. Any other config is
    returned as is."""
    if not isinstance(config, dict):
        return config
    import copy

    if not any(k in config for k in ("trace", "text_file")):
        added = [s for s in _ADDED_SECTIONS if s not in config]
        fields = [f for f in _ADDED_FIELDS
                  if f.split(".")[1] not in (config.get(f.split(".")[0]) or {})]
        if not (added or fields) or "job" not in config:
            return config
        out, defaults = copy.deepcopy(config), base_config()
        for section in added:
            out[section] = defaults[section].to_dict()
        for field in fields:
            section, name = field.split(".")
            if isinstance(out.get(section), dict):
                out[section][name] = defaults[section][name]
        return out

    out, job = copy.deepcopy(config), config.get("job")
    defaults, missing = base_config(), object()

    def pop(dotted: str):
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        return node.pop(leaf) if isinstance(node, dict) and leaf in node else missing

    def put(dotted: str, value, replace: bool = True) -> None:
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if replace or leaf not in node:
            node[leaf] = value

    for old, new in (*MOVED.items(), *MOVED_FOR_JOB.get(job, {}).items()):
        value = pop(old)
        if value is missing:
            continue
        if old == "text_file":
            new = _TEXT_FILES.get(job, "perplexity.text_file")
            for other in set(_TEXT_FILES.values()) - {new}:
                put(other, "", replace=False)
        put(new, value)
        if old in MOVED_FOR_JOB.get(job, {}):  # still the eval job's field, at its default
            section, leaf = old.split(".")
            put(old, defaults[section][leaf])

    def fill(section: ml_collections.ConfigDict, where: str) -> None:
        for key in section.keys():
            name, value = f"{where}{key}", section[key]
            if isinstance(value, ml_collections.ConfigDict):
                fill(value, f"{name}.")
            elif name.startswith(_NEW_FIELDS):
                put(name, value, replace=False)

    fill(defaults, "")
    return out


# A field's "not given" typed on the command line: the run would go on as if the flag were
# absent, so the flag is refused, saying what the field takes (`declared.check_typed`).
_POLICY = "a policy spec (left out: the preset's, or the default combination)"
NOT_GIVEN = {
    "cache.slots": (0, "a slot count >= 1 (left out: cache.capacity_frac sizes the cache)"),
    "policies.eviction": ("", _POLICY), "policies.prefetch": ("", _POLICY),
    "policies.miss": ("", _POLICY), "policies.routing": ("", _POLICY),
    "policies.preset": ("", "a preset name, specmd_1 .. specmd_5 (left out: none)"),
    "run.prompts": ((), "one prompt or more (left out: run.prompt runs)"),
}


# Full-size presets of each family (the grid configs' default scale).
FULL_PRESETS = {"olmoe": "olmoe-1b-7b", "mixtral": "mixtral-8x7b", "qwen2_moe": "qwen1.5-moe-a2.7b",
                "phimoe": "phi-3.5-moe"}


def replay_grid_config() -> ml_collections.ConfigDict:
    """The base of a replay grid's cells (`studies/*/grid_*.py`): the replay job on the virtual
    clock, the trace's own model, capacity counted as SpecMD counts it (a share of the whole
    model) with int4 as the cascade's plain precision, and no progress bar or TensorBoard
    (hundreds or thousands of cells: results.json only)."""
    c = base_config()
    c.job = "replay"
    c.model.preset = ""
    c.clock.kind = "virtual"
    c.cache.capacity_of = "model"
    c.cache.precision = "int4"
    c.log.progress = False
    c.log.tensorboard = False
    return c


def parse_args(arg: str | None, defaults: dict) -> dict:
    """`"scale=tiny,x=1"` -> dict over `defaults`; unknown keys are errors."""
    out = dict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            raise ValueError(f"config argument {item!r}: expected one of "
                             f"{sorted(defaults)} as key=value")
        out[key] = value
    return out


def cache_experiment(family: str, capacity_frac: float, arg: str | None):
    """A family at a cache capacity (SpecMD's 1%, 5%, 25% of the whole model's bytes).

    `scale=full` (default) is the published model: pass `--config.model.checkpoint=` with a
    converted checkpoint. `scale=tiny` runs on a CPU: the trained embedded model for OLMoE,
    random weights in the family's tiny shape otherwise; there the cache is floored at top-k
    slots (`cache.min_slots`), since 1% of a few hundred experts is below one layer's top-k.
    """
    args = parse_args(arg, {"scale": "full"})
    if args["scale"] not in ("full", "tiny"):
        raise ValueError(f"scale={args['scale']!r} must be full or tiny")
    c = base_config()
    c.model.family = family
    c.cache.capacity_frac = capacity_frac
    c.cache.capacity_of = "model"  # SpecMD counts capacity against the whole model
    if args["scale"] == "full":
        c.model.preset = FULL_PRESETS[family]
    else:
        c.model.preset = "embedded" if family == "olmoe" else "tiny"
        from moejax.families import preset as _preset
        from moejax.model_source import embedded_config

        tiny = embedded_config() if family == "olmoe" else _preset(family, "tiny")
        c.cache.min_slots = tiny.top_k
    return c
