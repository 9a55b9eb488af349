"""Open-loop streaming load generation (contracts.md section 3).

Modules: ``schedule`` (arrival offsets), ``records`` (JSONL attempt records, shared clock),
``sse`` (incremental stream parser and reply classification), ``client`` (``LoadSpec``,
``run_load``, ``run_load_blocking``, ``send_attempt``), ``fakeserver`` (misbehaving SSE test server).
CLI: ``python -m chaoslib_infer.load``.
"""
