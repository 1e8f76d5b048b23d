// Load workflows into the real ComfyUI editor (headless Debian Chromium, playwright-core), one fresh page each, and
// report what the editor complains about: node types it does not know, nodes it flags with errors, combo values
// not in their lists, widget lists longer or shorter than what the editor saves for the node, values it changed on
// load, a failing prompt conversion, dialogs, toasts and status cards, page errors. docs/testing.md has the setup,
// the controls (each must be reported) and the last results.
//
//   npm i playwright-core    # once, next to this file; the browser is Debian's /usr/bin/chromium
//   node check_workflows.mjs --server http://127.0.0.1:8188 --out DIR example_workflows/*.json
//
// Serve the model files the workflows name (empty placeholders are enough: `--extra-model-paths-config` to a folder
// of empty files) and an `example.png` in the server's input/ for Load Image, or every loader shows "Missing Models"
// and 1.45+ flags Load Image. A newer editor for an older backend:
// `pip install --no-deps --target DIR comfyui-frontend-package==1.58.1`, then start ComfyUI with
// `--front-end-root DIR/comfyui_frontend_package/static`. Load an empty graph too: editors log some errors on
// every page (1.27.10: "Cannot read properties of undefined (reading 'id')"; 1.45.20: "graph accessed before
// initialization"), which are not the workflow's.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

const arg = (k, d) => { const i = process.argv.indexOf(k); return i > 0 ? process.argv[i + 1] : d; };
const server = arg("--server", "http://127.0.0.1:8188");
const out = arg("--out", ".");
const files = process.argv.slice(2).filter((a, i, all) => a.endsWith(".json") && all[i - 1] !== "--out");
fs.mkdirSync(out, { recursive: true });
await fetch(`${server}/settings/Comfy.TutorialCompleted`, { method: "POST", body: "true" });

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const results = [];
for (const file of files) {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const logs = [];
  page.on("console", (m) => logs.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => logs.push(`pageerror: ${e.message}`));
  await page.goto(server, { waitUntil: "load" });
  await page.waitForFunction(() => window.app && window.app.graph && window.app.vueAppReady !== false, null, { timeout: 120000 });
  await page.waitForTimeout(1500);
  const wf = JSON.parse(fs.readFileSync(file, "utf8"));
  const name = path.basename(file, ".json");
  const r = await page.evaluate(async ({ wf, name }) => {
    const app = window.app;
    await app.loadGraphData(wf, true, true, name);
    await new Promise((r) => setTimeout(r, 1500));
    const registered = window.LiteGraph?.registered_node_types || {};
    const saved = Object.fromEntries(wf.nodes.map((n) => [n.id, n]));
    const nodes = app.graph._nodes.map((n) => {
      const file = saved[n.id] || {};
      const widgets = (n.widgets || []).map((w) => ({ name: w.name, value: w.value, options: w.options?.values }));
      // what the editor itself would save for this node: a different length than the file's shifts values
      const reSaved = n.serialize?.().widgets_values;
      const badCombo = widgets.filter((w) => Array.isArray(w.options) && w.options.length && !w.options.includes(w.value)
                                             && typeof w.value === "string");
      return { id: n.id, type: n.type, registered: !!registered[n.type], widgets: widgets.length,
               saved_values: Array.isArray(file.widgets_values) ? file.widgets_values.length : null,
               editor_values: Array.isArray(reSaved) ? reSaved.length : null,
               // values the editor changed on load (clamped to a widget's range, replaced by a default)
               values_changed: Array.isArray(reSaved) && Array.isArray(file.widgets_values)
                 && reSaved.length >= file.widgets_values.length
                 ? reSaved.slice(0, file.widgets_values.length).flatMap((v, i) => JSON.stringify(v) === JSON.stringify(file.widgets_values[i]) ? []
                                               : [`${widgets[i]?.name ?? i}: ${JSON.stringify(file.widgets_values[i])} -> ${JSON.stringify(v)}`])
                 : [],
               widget_names: widgets.map((w) => w.name), has_errors: !!n.has_errors,
               combo_values_not_listed: badCombo.map((w) => `${w.name}=${w.value}`) };
    });
    let promptError = null;
    try { await app.graphToPrompt(); } catch (e) { promptError = String(e); }
    return { nodes, promptError };
  }, { wf, name });
  const overlays = await page.evaluate(() => {
    // 1.58 reports missing models and inputs in a role="status" card ("3 issues found"), not a dialog
    const sel = '[role="dialog"], [role="alert"], [role="status"], .p-toast-message, .p-dialog, .p-message';
    const seen = new Set(), out = [];
    for (const el of document.querySelectorAll(sel)) {
      const t = (el.innerText || "").trim().replace(/\s+/g, " ");
      if (t && t.length < 2000 && !seen.has(t) && el.offsetParent !== null) { seen.add(t); out.push(t); }
    }
    return out;
  });
  await page.screenshot({ path: path.join(out, `${name}.png`) });
  const frontend = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ || null);
  const counted = (n) => n.saved_values !== null && n.editor_values !== null && n.saved_values !== n.editor_values;
  const coreGrew = (n) => !n.type.startsWith("FastAR_") && n.saved_values < n.editor_values && !n.values_changed.length;
  const missing = r.nodes.filter((n) => !n.registered && !["MarkdownNote", "Note"].includes(n.type)).map((n) => n.type);
  const errors = logs.filter((l) => /^(error|pageerror)/.test(l) && !/ERR_NAME_NOT_RESOLVED|Failed to load resource|404/.test(l));
  results.push({ workflow: name, frontend, missing, has_errors: r.nodes.filter((n) => n.has_errors).map((n) => n.type),
                 combo_values_not_listed: r.nodes.flatMap((n) => n.combo_values_not_listed.map((v) => `${n.type}.${v}`)),
                 // a saved list longer or shorter than the node's widgets shifts every value after the gap
                 widget_count_mismatch: r.nodes.filter((n) => counted(n) && !coreGrew(n))
                   .map((n) => `${n.type}#${n.id}: ${n.saved_values} in the file, the editor saves ${n.editor_values}`
                               + ` (${n.widget_names.join(",")})`),
                 // a newer core node with widgets added at the end (0.2x CreateVideo's bit_depth, 1.45+ PreviewAny's
                 // display widgets): the file's values stay in place and the new widgets take their defaults
                 core_widgets_added: r.nodes.filter((n) => counted(n) && coreGrew(n))
                   .map((n) => `${n.type}#${n.id}: ${n.saved_values} in the file, the editor saves ${n.editor_values}`),
                 values_changed: r.nodes.flatMap((n) => n.values_changed.map((v) => `${n.type}#${n.id}.${v}`)),
                 prompt_error: r.promptError, overlays, console_errors: errors.map((l) => l.slice(0, 300)) });
  console.log(JSON.stringify(results[results.length - 1]));
  await page.close();
}
fs.writeFileSync(path.join(out, "results.json"), JSON.stringify(results, null, 1));
await browser.close();
