// The page at "/": fills the pair list from GET /languages (and "Detect language" for each target),
// translates with POST /v1/attention (translation + word-level encoder-decoder attention per line),
// shows the route the text took (a pivot, the language detected) and highlights, while a target
// word is hovered, the source words it attended to.
"use strict";

const $ = (id) => document.getElementById(id);

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["X-API-Key"] = key;
  return h;
}

async function answer(response) {
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail || body.error || response.statusText);
  return body;
}

async function loadPairs() {
  const languages = await answer(await fetch("/languages"));
  const names = Object.fromEntries(languages.map((l) => [l.code, l.name]));
  const select = $("pair");
  // each language lists itself among its targets (as LibreTranslate does): no pair to translate
  const targets = (lang) => lang.targets.filter((t) => t !== lang.code);
  for (const lang of languages) {
    for (const target of targets(lang)) {
      const option = document.createElement("option");
      option.value = lang.code + "|" + target;
      option.textContent = `${lang.name} \u2192 ${names[target] || target}`;
      select.appendChild(option);
    }
  }
  for (const target of [...new Set(languages.flatMap(targets))].sort()) {
    const option = document.createElement("option");
    option.value = "auto|" + target;
    option.textContent = `Detect language \u2192 ${names[target] || target}`;
    select.appendChild(option);
  }
  if (!select.options.length) $("status").textContent = "this server has no language pairs";
  window.languageNames = names;
}

function describeRoute(body) {
  const names = window.languageNames || {};
  let text = "route: " + body.route.join(" \u2192 ");
  if (body.detected) {
    const lang = body.detected.language;
    text += ` (detected: ${names[lang] || lang}, ${Math.round(body.detected.confidence)}%)`;
  }
  return text;
}

function span(text, cls) {
  const s = document.createElement("span");
  s.className = "word " + cls;
  s.textContent = text;
  return s;
}

function showLine(alignment) {
  const line = document.createElement("div");
  line.className = "line";
  const target = document.createElement("div");
  const source = document.createElement("div");
  source.className = "src";
  const srcSpans = alignment.source_words.map((w, i) => {
    const s = span(w, "src-word");
    s.dataset.i = i;
    source.append(s, " ");
    return s;
  });
  alignment.target_words.forEach((w, j) => {
    const s = span(w, "tgt-word");
    s.dataset.j = j;
    const row = alignment.weights[j];
    const top = row.map((v, i) => [v, i]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    s.title = "attended to: " + top.map(([v, i]) => `${alignment.source_words[i]} (${Math.round(100 * v)}%)`).join(", ");
    s.addEventListener("mouseenter", () => {
      const max = Math.max(...row, 1e-9);
      srcSpans.forEach((t, i) => {
        t.dataset.weight = row[i].toFixed(4);
        t.style.background = `rgba(255, 140, 0, ${(row[i] / max).toFixed(3)})`;
      });
    });
    s.addEventListener("mouseleave", () => srcSpans.forEach((t) => {
      delete t.dataset.weight;
      t.style.background = "";
    }));
    target.append(s, " ");
  });
  line.append(target, source);
  return line;
}

async function translate() {
  const [source, target] = $("pair").value.split("|");
  const text = $("source").value.split("\n");
  $("status").textContent = "translating\u2026";
  $("route").textContent = "";
  $("translate").disabled = true;
  try {
    const body = await answer(await fetch("/v1/attention", {
      method: "POST", headers: headers(), body: JSON.stringify({ text, source, target }),
    }));
    $("plain").textContent = body.alignments.map((a) => a.translation).join("\n");
    $("route").textContent = describeRoute(body);
    $("lines").replaceChildren(...body.alignments.filter((a) => a.target_words.length).map(showLine));
    $("status").textContent = "";
  } catch (e) {
    $("status").textContent = "error: " + e.message;
  } finally {
    $("translate").disabled = false;
  }
}

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate(); });
loadPairs().catch((e) => { $("status").textContent = "error: " + e.message; });
