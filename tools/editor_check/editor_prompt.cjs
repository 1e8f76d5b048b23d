// Load one workflow into the real ComfyUI editor (headless Chromium, playwright-core), set some widgets, and print
// what the editor shows (dialogs, toasts, status cards, combo values it does not list) and the API prompt its Queue
// button would send (app.graphToPrompt), as one JSON line. tests/test_comfyui_host.py queues that prompt.
//
//   NODE_PATH=.../node_modules node editor_prompt.cjs SERVER WORKFLOW.json CHROMIUM '{"NodeType": {"widget": value}}'
const { chromium } = require("playwright-core");
const fs = require("node:fs");

const [server, file, executablePath, setJson] = process.argv.slice(2);
const settings = JSON.parse(setJson || "{}");

(async () => {
  await fetch(`${server}/settings/Comfy.TutorialCompleted`, { method: "POST", body: "true" });
  const browser = await chromium.launch({
    executablePath,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(server, { waitUntil: "load" });
  await page.waitForFunction(() => window.app && window.app.graph && window.app.vueAppReady !== false, null,
                             { timeout: 120000 });
  await page.waitForTimeout(1500);
  const workflow = JSON.parse(fs.readFileSync(file, "utf8"));
  const result = await page.evaluate(async ({ workflow, settings }) => {
    const app = window.app;
    await app.loadGraphData(workflow, true, true, "workflow");
    await new Promise((r) => setTimeout(r, 1500));
    const unset = [];
    for (const node of app.graph._nodes) {
      for (const [name, value] of Object.entries(settings[node.type] || {})) {
        const widget = (node.widgets || []).find((w) => w.name === name);
        if (!widget) { unset.push(`${node.type}.${name}`); continue; }
        widget.value = value;
        widget.callback?.(value);
      }
    }
    const notListed = app.graph._nodes.flatMap((n) => (n.widgets || [])
      .filter((w) => Array.isArray(w.options?.values) && w.options.values.length && typeof w.value === "string"
                     && !w.options.values.includes(w.value))
      .map((w) => `${n.type}.${w.name}=${w.value}`));
    const { output } = await app.graphToPrompt();
    return { unset, combo_values_not_listed: notListed, prompt: output };
  }, { workflow, settings });
  result.overlays = await page.evaluate(() => {
    const sel = '[role="dialog"], [role="alert"], [role="status"], .p-toast-message, .p-dialog, .p-message';
    const seen = new Set(), out = [];
    for (const el of document.querySelectorAll(sel)) {
      const t = (el.innerText || "").trim().replace(/\s+/g, " ");
      if (t && t.length < 2000 && !seen.has(t) && el.offsetParent !== null) { seen.add(t); out.push(t); }
    }
    return out;
  });
  result.frontend = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ || null);
  result.page_errors = errors;
  console.log(JSON.stringify(result));
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
