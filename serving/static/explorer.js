// skattn attention explorer: pick a model, type a source, read the alignment matrix.
//
// Talks to the server through the Open Inference Protocol, like any other client:
//   GET  v2/models               the served models (skattn's listing, see serving/explorer.py)
//   POST v2/models/{name}/infer  BYTES "source" [1] -> "prediction", FP32 "attention"
//                                [1, T_y, T_x] and INT32 "attention_lengths" [1, 2], with
//                                parameters.temperature rescaling the attention scores and,
//                                for a Transformer decoder (the listing's attention_layers and
//                                attention_heads > 0), parameters.attention_layer and
//                                attention_head choosing the cross-attention drawn.
// Row i of a map is output step i; column j is source token j, the last column the
// end-of-source marker </s>. Each row sums to 1: alpha_ij, and the context vector of step i is
// c_i = sum_j alpha_ij h_j (h_j the encoder's annotation of source token j).
"use strict";

const T_MIN = 0.05;
const T_MAX = 20;
const SLIDER_STEPS = 1000; // the range input's max: log-spaced temperatures
const EOS_LABEL = "</s>";
const UNK_LABEL = "<unk>";
const SHOWN_TERM_MIN = 0.001; // recipe terms below this weight are counted, not written out
const HOVER_HINT = "Hover over a cell to read its weight; click a row for its recipe.";

// -- temperature on a log scale ----------------------------------------------------------------

/** tau = T_MIN * (T_MAX / T_MIN) ** (v / SLIDER_STEPS) */
function sliderToTemperature(value) {
  return T_MIN * Math.pow(T_MAX / T_MIN, Number(value) / SLIDER_STEPS);
}

/** The slider position nearest to tau (clamped to [T_MIN, T_MAX]). */
function temperatureToSlider(tau) {
  const t = Math.min(T_MAX, Math.max(T_MIN, tau));
  return Math.round((SLIDER_STEPS * Math.log(t / T_MIN)) / Math.log(T_MAX / T_MIN));
}

function formatTemperature(tau) {
  if (tau < 0.01) return tau.toExponential(1); // below the slider's range: 1.0e-3, not 0.00
  return tau < 1 ? tau.toFixed(2) : tau < 10 ? tau.toFixed(1) : tau.toFixed(0);
}

// -- tokens, as skattn.text splits them ------------------------------------------------------------

// Python's str.split() whitespace (str.isspace), which JavaScript's \s is not: \s takes U+FEFF
// and leaves U+001C-U+001F and U+0085 out.
const PY_SPACE = "[\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]+";
const PY_SPLIT = new RegExp(PY_SPACE);
const PY_TRIM = new RegExp(`^${PY_SPACE}|${PY_SPACE}$`, "g");

/** "char": one token per code point (Python's list(text)); "space": text.split(). */
function tokenize(text, kind) {
  if (kind === "space") {
    const trimmed = text.replace(PY_TRIM, "");
    return trimmed === "" ? [] : trimmed.split(PY_SPLIT);
  }
  return Array.from(text);
}

/** Labels for n positions: the tokens when there are exactly n of them, else prefix + index. */
function labels(tokens, n, prefix) {
  if (tokens.length === n) return tokens;
  return Array.from({ length: n }, (_, i) => `${prefix}${i + 1}`);
}

/** A token as shown in a header: blanks made visible. */
function showToken(token) {
  return token === " " ? "\u2423" : token;
}

// -- the server --------------------------------------------------------------------------------

class ServerError extends Error {
  constructor(status, message, retryAfter) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

/** How long a request may take before the page gives up on it (a server or proxy that never
 *  answers would otherwise hold the page in "loading" and every later query behind it). */
const REQUEST_TIMEOUT_MS = 60_000;

async function fetchJson(url, options) {
  let response;
  try {
    response = await fetch(url, { ...options, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
  } catch (error) {
    if (error.name === "TimeoutError") {
      throw new ServerError(0, `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`, null);
    }
    throw new ServerError(0, `cannot reach the server (${error.message})`, null);
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch {
    payload = null;
  }
  if (!response.ok) {
    const message = payload && typeof payload.error === "string" ? payload.error : response.statusText;
    throw new ServerError(response.status, message, response.headers.get("Retry-After"));
  }
  if (payload === null) {
    throw new ServerError(0, `${url} answered ${response.status} without a JSON body`, null);
  }
  return payload;
}

async function listModels() {
  const models = await fetchJson("v2/models");
  if (!Array.isArray(models)) throw new ServerError(0, "GET v2/models did not return a list", null);
  return models;
}

/** One source through one model: {prediction, weights: T_y arrays of T_x numbers}.
 *  maps: {layer, head} (head null: the mean over heads), or null for the model's default map. */
async function infer(modelName, source, temperature, maps) {
  const parameters = { temperature };
  if (maps) {
    parameters.attention_layer = maps.layer;
    if (maps.head !== null) parameters.attention_head = maps.head;
  }
  const body = {
    inputs: [{ name: "source", datatype: "BYTES", shape: [1], data: [source] }],
    outputs: [{ name: "prediction" }, { name: "attention" }, { name: "attention_lengths" }],
    parameters,
  };
  const payload = await fetchJson(`v2/models/${encodeURIComponent(modelName)}/infer`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return parseAlignment(payload);
}

/** Item 0 of an infer response, with its zero-padded attention map cut to (T_y, T_x). */
function parseAlignment(payload) {
  const outputs = Object.fromEntries((payload.outputs || []).map((o) => [o.name, o]));
  for (const name of ["prediction", "attention", "attention_lengths"]) {
    if (!outputs[name] || !Array.isArray(outputs[name].data)) {
      throw new ServerError(0, `the response has no "${name}" output in JSON`, null);
    }
  }
  const data = outputs.attention.data.flat(Infinity); // row-major [N, T_y max, T_x max]
  const [, , txMax] = outputs.attention.shape;
  const [ty, tx] = outputs.attention_lengths.data.flat(Infinity);
  const weights = [];
  for (let i = 0; i < ty; i++) weights.push(data.slice(i * txMax, i * txMax + tx));
  return { prediction: String(outputs.prediction.data.flat(Infinity)[0]), weights };
}

function describeError(modelName, error) {
  const where = `model "${modelName}"`;
  if (error.status === 0) return `${where}: ${error.message}`;
  if (error.status === 503) {
    const retry = error.retryAfter ? ` Try again in ${error.retryAfter} s.` : "";
    return `${where}: the server is busy (503): ${error.message}.${retry}`;
  }
  const kind = error.status < 500 ? "refused the request" : "failed";
  return `${where}: the server ${kind} (${error.status}): ${error.message}`;
}

// -- colours ---------------------------------------------------------------------------------------

const RAMP = [
  [0.0, [247, 251, 255]],
  [0.25, [198, 219, 239]],
  [0.5, [107, 174, 214]],
  [0.75, [33, 113, 181]],
  [1.0, [8, 48, 107]],
];

/** A sequential blue ramp: weight 0 is near white, weight 1 dark blue. */
function weightColour(w) {
  const x = Math.min(1, Math.max(0, w));
  let k = 1;
  while (k < RAMP.length - 1 && RAMP[k][0] < x) k++;
  const [x0, c0] = RAMP[k - 1];
  const [x1, c1] = RAMP[k];
  const f = (x - x0) / (x1 - x0);
  const rgb = c0.map((c, i) => Math.round(c + f * (c1[i] - c)));
  return `rgb(${rgb.join(", ")})`;
}

// -- one panel: prediction, heatmap, hover readout, recipe -----------------------------------------

class Panel {
  constructor(root) {
    this.root = root;
    this.title = root.querySelector(".panel-title");
    this.prediction = root.querySelector(".prediction");
    this.note = root.querySelector(".note");
    this.table = root.querySelector(".heatmap");
    this.readout = root.querySelector(".readout");
    this.recipe = root.querySelector(".recipe");
    this.result = null;
    this.selectedRow = null;
    this.table.addEventListener("click", (event) => {
      const row = event.target.closest("tbody tr");
      if (row) this.select(Number(row.dataset.row));
    });
    this.table.addEventListener("keydown", (event) => this.onKey(event));
    this.table.addEventListener("mouseover", (event) => {
      const cell = event.target.closest("td.cell");
      if (cell) this.showReadout(Number(cell.dataset.row), Number(cell.dataset.col));
    });
  }

  show(visible) {
    this.root.hidden = !visible;
  }

  /** Draw a result: {model, source, prediction, weights, rowLabels, colLabels, maps}. */
  render(result) {
    this.result = result;
    const attention = result.model.attention || "?";
    this.title.textContent = `${result.model.name} (${describeModel(result.model)})`;
    this.prediction.textContent = result.prediction;
    this.note.textContent =
      attention === "none"
        ? "No attention: the decoder only ever receives the final encoder state, so every row " +
          `puts all its weight on the last column (${EOS_LABEL}).`
        : describeMaps(result.model, result.maps);
    this.drawHeatmap();
    this.readout.textContent = HOVER_HINT;
    const rows = result.weights.length;
    this.select(this.selectedRow !== null && this.selectedRow < rows ? this.selectedRow : null);
    this.root.dataset.rows = String(rows);
    this.root.dataset.updates = String(Number(this.root.dataset.updates) + 1);
  }

  clear(message) {
    this.result = null;
    this.selectedRow = null;
    this.prediction.textContent = "";
    this.note.textContent = message || "";
    this.table.replaceChildren();
    this.recipe.replaceChildren();
    this.readout.textContent = "";
    this.root.dataset.rows = "0";
    this.root.dataset.updates = String(Number(this.root.dataset.updates) + 1);
  }

  drawHeatmap() {
    const { weights, rowLabels, colLabels } = this.result;
    const head = document.createElement("thead");
    const headRow = head.insertRow();
    const corner = document.createElement("th");
    corner.className = "corner";
    const across = document.createElement("span");
    across.textContent = "source \u2192";
    const down = document.createElement("span");
    down.textContent = "output \u2193";
    corner.append(across, down);
    headRow.append(corner);
    colLabels.forEach((label, j) => {
      const th = document.createElement("th");
      th.scope = "col";
      th.dataset.col = String(j);
      th.textContent = showToken(label);
      headRow.append(th);
    });
    const body = document.createElement("tbody");
    weights.forEach((row, i) => {
      const tr = body.insertRow();
      tr.dataset.row = String(i);
      tr.tabIndex = 0;
      tr.setAttribute("aria-label", `output step ${i + 1}: ${rowLabels[i]}; show its recipe`);
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = showToken(rowLabels[i]);
      tr.append(th);
      row.forEach((w, j) => {
        const td = tr.insertCell();
        td.className = "cell";
        td.dataset.row = String(i);
        td.dataset.col = String(j);
        td.dataset.weight = String(w);
        td.title = `${rowLabels[i]} \u2190 ${colLabels[j]}: ${w.toFixed(3)}`;
        td.style.backgroundColor = weightColour(w);
      });
    });
    this.table.replaceChildren(head, body);
  }

  showReadout(i, j) {
    const { weights, rowLabels, colLabels } = this.result;
    this.readout.textContent =
      `output step ${i + 1} "${rowLabels[i]}" reads source position ${j + 1} ` +
      `"${colLabels[j]}" with weight \u03b1 = ${weights[i][j].toFixed(4)}`;
  }

  onKey(event) {
    const row = event.target.closest("tbody tr");
    if (!row || !this.result) return;
    const i = Number(row.dataset.row);
    const next = { ArrowDown: i + 1, ArrowUp: i - 1 }[event.key];
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      this.select(i);
    } else if (next !== undefined && next >= 0 && next < this.result.weights.length) {
      event.preventDefault();
      this.select(next);
      this.table.querySelector(`tbody tr[data-row="${next}"]`).focus();
    }
  }

  /** Highlight row i and write its recipe (null: no row selected). */
  select(i) {
    this.selectedRow = i;
    for (const tr of this.table.querySelectorAll("tbody tr")) {
      const selected = Number(tr.dataset.row) === i;
      tr.classList.toggle("selected", selected);
      tr.setAttribute("aria-selected", String(selected));
    }
    if (i === null || !this.result) {
      this.recipe.replaceChildren();
      return;
    }
    this.recipe.replaceChildren(...recipeNodes(this.result, i));
  }
}

/** The recipe of step i: each source token's weight, largest first, and c_i as a weighted sum. */
function recipeNodes(result, i) {
  const { weights, rowLabels, colLabels } = result;
  const order = weights[i].map((w, j) => [w, j]).sort((a, b) => b[0] - a[0] || a[1] - b[1]);

  const heading = document.createElement("h3");
  heading.textContent = `Step ${i + 1}: output "${rowLabels[i]}"`;

  const list = document.createElement("ol");
  list.className = "recipe-list";
  for (const [w, j] of order) {
    const li = document.createElement("li");
    li.dataset.col = String(j);
    li.dataset.weight = String(w);
    const token = document.createElement("span");
    token.className = "token";
    token.textContent = `${showToken(colLabels[j])} (h${subscript(j + 1)})`;
    const track = document.createElement("span");
    track.className = "bar-track";
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.display = "block";
    bar.style.width = `${(100 * Math.min(1, Math.max(0, w))).toFixed(1)}%`;
    track.append(bar);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = w.toFixed(3);
    li.append(token, track, value);
    list.append(li);
  }

  const shown = order.filter(([w]) => w >= SHOWN_TERM_MIN);
  const hidden = order.length - shown.length;
  const terms = shown.map(([w, j]) => `${w.toFixed(3)}\u00b7h${subscript(j + 1)}`);
  if (hidden > 0) terms.push(`(${hidden} more, each < ${SHOWN_TERM_MIN})`);
  const context = document.createElement("p");
  context.className = "context";
  context.textContent = `c${subscript(i + 1)} = \u03a3\u2c7c \u03b1${subscript(i + 1)}\u2c7c h\u2c7c = ${terms.join(" + ")}`;

  return [heading, list, context];
}

const SUBSCRIPTS = "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089";

function subscript(n) {
  return String(n).replace(/\d/g, (d) => SUBSCRIPTS[Number(d)]);
}

/** Which cross-attention a map is, for a model with layers and heads ("" otherwise). */
function describeMaps(model, maps) {
  const layers = model.attention_layers || 0;
  const heads = model.attention_heads || 0;
  if (layers === 0) return "";
  const layer = maps ? maps.layer : layers - 1;
  const head = maps ? maps.head : null;
  const which = head === null ? `the mean of its ${heads} heads` : `head ${head + 1} of ${heads}`;
  return `Cross-attention of decoder layer ${layer + 1} of ${layers}, ${which}.`;
}

function describeModel(model) {
  if (model.attention === "none") return `${model.decoder || "?"} decoder, no attention`;
  const parts = [model.decoder && `${model.decoder} decoder`, model.scorer && `${model.scorer} score`];
  if (model.attention && model.attention !== "global") parts.push(`${model.attention} attention`);
  return parts.filter(Boolean).join(", ") || "attention";
}

// -- the page ----------------------------------------------------------------------------------------

class Explorer {
  constructor(doc) {
    this.root = doc.getElementById("explorer");
    this.form = doc.getElementById("controls");
    this.modelSelect = doc.getElementById("model");
    this.modelInfo = doc.getElementById("model-info");
    this.source = doc.getElementById("source");
    this.slider = doc.getElementById("temperature");
    this.sliderValue = doc.getElementById("temperature-value");
    this.resetButton = doc.getElementById("temperature-reset");
    this.compareField = doc.getElementById("compare-field");
    this.compareBox = doc.getElementById("compare");
    this.compareLabel = doc.getElementById("compare-label");
    this.mapsField = doc.getElementById("maps-field");
    this.layerSelect = doc.getElementById("layer");
    this.headSelect = doc.getElementById("head");
    this.error = doc.getElementById("error");
    this.main = new Panel(doc.getElementById("panel-main"));
    this.compare = new Panel(doc.getElementById("panel-compare"));
    this.models = [];
    this.temperature = 1;
    // One query at a time: changes that arrive meanwhile (a dragged slider) are folded into
    // one more query with the latest inputs, so answers are drawn in order, never stale.
    this.running = false;
    this.stale = false;
  }

  async start(params) {
    this.slider.min = "0";
    this.slider.max = String(SLIDER_STEPS);
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.refresh();
    });
    this.modelSelect.addEventListener("change", () => {
      this.onModelChange(null);
      this.queryIfTyped();
    });
    this.slider.addEventListener("input", () => {
      this.setTemperature(sliderToTemperature(this.slider.value), false);
      this.queryIfTyped();
    });
    this.resetButton.addEventListener("click", () => {
      const model = this.currentModel(); // none before the models are listed, or if that failed
      if (!model) return;
      this.setTemperature(model.temperature ?? 1, true);
      this.queryIfTyped();
    });
    this.compareBox.addEventListener("change", () => this.queryIfTyped());
    this.layerSelect.addEventListener("change", () => this.queryIfTyped());
    this.headSelect.addEventListener("change", () => this.queryIfTyped());

    try {
      this.models = await listModels();
    } catch (error) {
      this.showError(`Cannot list the models: ${error.message}`);
      this.root.dataset.state = "idle";
      return;
    }
    if (this.models.length === 0) {
      this.showError("This server hosts no model.");
      this.root.dataset.state = "idle";
      return;
    }
    for (const model of this.models) {
      const option = new Option(model.ready ? model.name : `${model.name} (not ready)`, model.name);
      this.modelSelect.append(option);
    }
    const wanted = this.models.find((m) => m.name === params.get("model"));
    const first = this.models.find((m) => m.attention !== "none") || this.models[0];
    this.modelSelect.value = (wanted || first).name;
    const tau = Number(params.get("temperature"));
    this.onModelChange(Number.isFinite(tau) && tau > 0 ? tau : null);
    this.selectMaps(params.get("layer"), params.get("head"));
    if (params.get("compare") === "1") this.compareBox.checked = !this.compareField.hidden;
    if (params.has("source")) {
      this.source.value = params.get("source");
      await this.refresh();
    } else {
      this.root.dataset.state = "idle";
    }
  }

  currentModel() {
    return (this.models || []).find((m) => m.name === this.modelSelect.value);
  }

  /** The model without attention to show beside `model`: one trained on the same data (same
   *  vocabularies), else, where a model does not say its vocabularies, one that reads and
   *  writes the same kind of tokens; null if none (models of other data are never paired). */
  partnerFor(model) {
    if (!model || model.attention === "none") return null;
    const bare = this.models.filter((m) => m.attention === "none");
    const sameData = bare.find((m) => m.vocabulary_id && m.vocabulary_id === model.vocabulary_id);
    const sameKind = bare.find(
      (m) =>
        !(m.vocabulary_id && model.vocabulary_id) &&
        m.tokenizer === model.tokenizer &&
        m.output_kind === model.output_kind,
    );
    return sameData || sameKind || null;
  }

  onModelChange(temperature) {
    const model = this.currentModel();
    this.modelInfo.textContent = `${describeModel(model)}; ${model.tokenizer || "?"} tokens`;
    this.setTemperature(temperature ?? model.temperature ?? 1, true);
    this.setMapOptions(model);
    const partner = this.partnerFor(model);
    this.compareField.hidden = partner === null;
    if (partner === null) this.compareBox.checked = false;
    else this.compareLabel.textContent = `side by side with ${partner.name} (no attention)`;
  }

  /** Layer and head selectors for a model that has them: layers 1..L (the last by default),
   *  heads "mean" then 1..H. Hidden for models without (RNN decoders, older artifacts). */
  setMapOptions(model) {
    const layers = model.attention_layers || 0;
    const heads = model.attention_heads || 0;
    this.mapsField.hidden = layers === 0;
    const layerOptions = Array.from({ length: layers }, (_, l) =>
      new Option(l === layers - 1 ? `${l + 1} (last)` : String(l + 1), String(l)),
    );
    const headOptions = [new Option(`mean of ${heads}`, "")];
    for (let h = 0; h < heads; h++) headOptions.push(new Option(String(h + 1), String(h)));
    this.layerSelect.replaceChildren(...layerOptions);
    this.headSelect.replaceChildren(...(layers === 0 ? [] : headOptions));
    if (layers > 0) this.layerSelect.value = String(layers - 1);
  }

  /** Select a layer and head given as the server's indices (negative layers count from the
   *  last), e.g. from the URL; values out of range are ignored. */
  selectMaps(layer, head) {
    const layers = this.layerSelect.options.length;
    const l = Number(layer);
    if (layer !== null && Number.isInteger(l) && l >= -layers && l < layers) {
      this.layerSelect.value = String(((l % layers) + layers) % layers);
    }
    const heads = this.headSelect.options.length - 1; // the first option is the mean
    const h = Number(head);
    if (head !== null && Number.isInteger(h) && h >= -heads && h < heads) {
      this.headSelect.value = String(((h % heads) + heads) % heads); // -1: the last, as the server reads it
    }
  }

  /** The chosen {layer, head}, or null for the default map (last layer, mean over heads),
   *  which the server computes without the extra pass. */
  currentMaps() {
    if (this.mapsField.hidden) return null;
    const layers = this.layerSelect.options.length;
    const layer = Number(this.layerSelect.value);
    const head = this.headSelect.value === "" ? null : Number(this.headSelect.value);
    return layer === layers - 1 && head === null ? null : { layer, head };
  }

  setTemperature(tau, moveSlider) {
    // Not clamped to the slider's range: a model's own temperature (or the URL's) may lie
    // outside it, and the page must decode as the API does by default; only the slider's
    // position is clamped.
    this.temperature = tau;
    if (moveSlider) this.slider.value = String(temperatureToSlider(tau));
    const shown = formatTemperature(this.temperature);
    this.sliderValue.textContent = `\u03c4 = ${shown}`;
    this.slider.setAttribute("aria-valuetext", `temperature ${shown}`);
  }

  queryIfTyped() {
    if (this.main.result !== null || this.source.value !== "") this.refresh();
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = false;
  }

  clearError() {
    this.error.textContent = "";
    this.error.hidden = true;
  }

  /** Query with the current inputs now, or once the query in flight has been drawn. */
  async refresh() {
    this.stale = true;
    if (this.running) return;
    this.running = true;
    this.root.dataset.state = "loading";
    try {
      while (this.stale) {
        this.stale = false;
        await this.query();
      }
    } finally {
      this.running = false;
      this.root.dataset.state = "idle";
    }
  }

  /** Send the source to the chosen model (and its no-attention partner) and draw the answers. */
  async query() {
    const model = this.currentModel();
    if (!model) return;
    const partner = this.compareBox.checked ? this.partnerFor(model) : null;
    const source = this.source.value;
    const jobs = [[this.main, model]];
    if (partner) jobs.push([this.compare, partner]);
    const maps = this.currentMaps(); // the partner (no attention) has none
    const outcomes = await Promise.allSettled(
      jobs.map(([, m]) => infer(m.name, source, this.temperature, m === model ? maps : null)),
    );
    this.compare.show(partner !== null);
    const errors = [];
    outcomes.forEach((outcome, k) => {
      const [panel, m] = jobs[k];
      if (outcome.status === "fulfilled") {
        const result = this.annotate(m, source, outcome.value);
        panel.render({ ...result, maps: m === model ? maps : null });
      } else {
        panel.clear("No result: see the message above.");
        errors.push(describeError(m.name, outcome.reason));
      }
    });
    if (errors.length) this.showError(errors.join("\n"));
    else this.clearError();
  }

  /** Row and column labels for an answer: output tokens and source tokens plus </s>. */
  annotate(model, source, answer) {
    const ty = answer.weights.length;
    const tx = ty > 0 ? answer.weights[0].length : tokenize(source, model.tokenizer).length + 1;
    const outputTokens =
      model.output_kind === "tokens"
        ? answer.prediction.split(" ").filter((t) => t !== "")
        : tokenize(answer.prediction, model.tokenizer);
    // A token outside the model's vocabulary is read as <unk>: label it so (when the listing
    // carries the vocabulary; a large one is not listed, and its tokens are shown as typed).
    const listed = model.source_tokens || [];
    const known = listed.length ? new Set(listed) : null;
    const read = (token) => (known && !known.has(token) ? UNK_LABEL : token);
    const sourceTokens = [...tokenize(source, model.tokenizer).map(read), EOS_LABEL];
    return {
      model,
      source,
      prediction: answer.prediction,
      weights: answer.weights,
      rowLabels: labels(outputTokens, ty, "y"),
      colLabels: labels(sourceTokens, tx, "x"),
    };
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const explorer = new Explorer(document);
  window.skattnExplorer = explorer; // for the console and for tests
  explorer.start(new URLSearchParams(window.location.search));
});
