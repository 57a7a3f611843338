"""Serving over HTTP.

server.py  — ``transduce serve``: the FastAPI app, limits, command line
batcher.py — dynamic batching of concurrent requests on one worker thread
bench.py   — load test: throughput and p50/p95 latency, batched vs one request at a time
"""
