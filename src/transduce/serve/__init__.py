"""Serving over HTTP.

command.py   — ``transduce serve``: command line, LT_* variables, uvicorn
server.py    — the FastAPI app and its middleware (CORS, body limit, metrics)
service.py   — what both APIs share: limits, key checks, routing, running work on a model's batcher
libre.py     — the LibreTranslate API (/translate, /detect, /languages, /frontend/settings, /suggest)
fields.py    — LibreTranslate request fields from the query string, JSON or form data, leniently
texts.py     — whole texts split into sentences and put back; malformed HTML repaired
languages.py — /languages' standard codes and names, pivot routes through a third language
v1.py        — transduce's own API (/v1/translate, /v1/attention, /v1/models)
registry.py  — models TOML / directory of models, lazy loading within a memory budget (LRU)
files.py     — POST /translate_file, GET /download_file (formats: transduce.text.files); expiry, no path escape
suggestions.py — suggested translations (POST /suggest) in SQLite, exported as TSV for fine-tuning
keys.py      — API keys file, constant-time comparison, per-key request limits
metrics.py   — Prometheus /metrics
alignment.py — word-level encoder–decoder attention for the page
batcher.py   — dynamic batching of concurrent requests, decoded by several workers per model
replicas.py  — workers as processes with a copy of the model each; processes or threads chosen in one place
static/      — the page at / (HTML + JS, no build step)
"""
