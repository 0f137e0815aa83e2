"""`/metrics` reports what the engine's steps copy: keys/values stored (the forwarded columns only), moved between
slots, image features."""

from __future__ import annotations

import httpx
from serve_helpers import running

from dllm_rl.sampling import DecodeConfig

PER_COLUMN = 4 * 2 * 4 * 32 * 4  # the demo block model: layers x (keys, values) x KV heads x head dim x float32


def test_metrics_report_the_bytes_each_step_copies(make_server, demo_model):
    _, tok = demo_model
    prompt = "nums 6 2 1 target 14\n"
    n_prompt = len(tok.encode(prompt, add_special_tokens=False))
    server = make_server(DecodeConfig(gen_length=8, steps=4), slots=4)
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        for seed in range(2):
            client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "seed": seed}).raise_for_status()
        text = client.get("/metrics").text
    m = {ln.split()[0].removeprefix("dllm_rl_"): int(ln.split()[1]) for ln in text.splitlines()
         if ln.startswith("dllm_rl_engine_") and "bytes" in ln}
    copies = server.worker.engine.copies
    assert m == {"engine_kv_bytes_written_total": copies.total["kv_written"],
                 "engine_kv_bytes_moved_total": 0, "engine_image_bytes_copied_total": 0,
                 "engine_step_bytes_copied_last": copies.last_step, "engine_step_bytes_copied_max": copies.max_step}
    # a request's first step stores its prompt (and first block); each later step its block, 4 columns (8 folding
    # the finished one in): two requests of 8 answer slots, 4 steps a block
    assert copies.max_step >= n_prompt * PER_COLUMN and copies.last_step == 4 * PER_COLUMN
    assert "# TYPE dllm_rl_engine_kv_bytes_written_total counter" in text
