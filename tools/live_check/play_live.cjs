// Drive a Live World node in the real ComfyUI editor (headless Debian chromium, playwright-core): load a workflow,
// queue it, click the playing node, hold keys while its frames arrive, take a screenshot mid-play, and report the
// frames the page drew (frame index, camera, pixels) and the keys it sent. With --cancel it presses ComfyUI's
// Cancel after a few frames instead, and reports how the play ended and what its route answers afterwards.
// Prints one JSON line.
//
//   NODE_PATH=<folder with playwright-core> node play_live.cjs --server URL --chromium PATH --workflow FILE \
//     --out DIR [--keys '[["ArrowRight", 12], ["s", 10], [null, 6]]'] [--cancel [--hostile BODIES.json]]
//
// --hostile: a JSON list of [name, base64 body] posted to the running play's key route from the page before the
// Cancel; the status of each is reported (and that of a well-formed key state after them).
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { chromium } = require("playwright-core");

const arg = (k, d) => { const i = process.argv.indexOf(k); return i > 0 ? process.argv[i + 1] : d; };
const server = arg("--server"), out = arg("--out", ".");
const keys = JSON.parse(arg("--keys", "[]"));
const cancel = process.argv.includes("--cancel");

(async () => {
  fs.mkdirSync(out, { recursive: true });
  await fetch(`${server}/settings/Comfy.TutorialCompleted`, { method: "POST", body: "true" });
  const browser = await chromium.launch({ executablePath: arg("--chromium", "/usr/bin/chromium"),
                                          args: ["--no-sandbox", "--disable-gpu", "--no-first-run"] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e.message)));
  await page.goto(server, { waitUntil: "load" });
  await page.waitForFunction(() => window.app && window.app.graph && window.fastarLive, null, { timeout: 120000 });
  await page.waitForTimeout(1500);
  const frontend = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ || null);
  const workflow = JSON.parse(fs.readFileSync(arg("--workflow"), "utf8"));
  await page.evaluate(async (wf) => { await window.app.loadGraphData(wf, true, true, "live"); }, workflow);
  await page.waitForTimeout(1000);
  await page.evaluate(() => window.app.queuePrompt(0, 1));
  // The play starts once the model is loaded: its node is the one the page was told of.
  await page.waitForFunction(() => window.fastarLive.started.length > 0, null, { timeout: 300000 });
  const start = await page.evaluate(() => window.fastarLive.started[window.fastarLive.started.length - 1]);
  // Click the node's title bar, as a person does, to select it (its keys go to the play while it is selected).
  const box = await page.evaluate((id) => {
    const app = window.app, node = app.graph.getNodeById(Number(id));
    app.canvas.ds.scale = 1; // the node at full size, for the click and the screenshot
    app.canvas.ds.offset = [-node.pos[0] + 420, -node.pos[1] + 160]; // clear of the editors' side and top bars
    app.canvas.setDirty(true, true);
    const rect = app.canvas.canvas.getBoundingClientRect();
    const [x, y] = app.canvas.ds.convertOffsetToCanvas([node.pos[0] + 40, node.pos[1] - 12]);
    const [x0, y0] = app.canvas.ds.convertOffsetToCanvas([node.pos[0], node.pos[1] - 30]);
    const [x1, y1] = app.canvas.ds.convertOffsetToCanvas([node.pos[0] + node.size[0], node.pos[1] + node.size[1]]);
    return { click: [rect.left + x, rect.top + y], clip: { x: rect.left + x0, y: rect.top + y0, width: x1 - x0,
                                                           height: y1 - y0 } };
  }, start.node);
  await page.mouse.click(...box.click);
  await page.mouse.move(5, 995); // off the node: no tooltip over the screenshot
  const selected = await page.evaluate((id) => Object.values(window.app.canvas.selected_nodes || {})
    .some((n) => String(n.id) === String(id)), start.node);
  const shown = () => page.evaluate(() => window.fastarLive.frames);
  const waitFrames = async (n) => { const target = (await shown()) + n;
    await page.waitForFunction((t) => window.fastarLive.frames >= t || window.fastarLive.ended.length > 0, target,
                               { timeout: 300000 }); };
  const result = { frontend, errors, selected, play: start.play, node: start.node, holds: [] };
  if (cancel) {
    await waitFrames(3);
    const hostile = arg("--hostile") ? JSON.parse(fs.readFileSync(arg("--hostile"), "utf8")) : [];
    result.hostile = await page.evaluate(async ({ play, hostile }) => {
      const post = async (body) => (await fetch(`/fastar/live/${play}/keys`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body })).status;
      const statuses = [];
      for (const [name, b64] of hostile) {
        statuses.push([name, await post(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)))]);
      }
      statuses.push(["a key state after them", await post(JSON.stringify({ keys: ["d"] }))]);
      return statuses;
    }, { play: start.play, hostile });
    await page.evaluate(() => window.app.api.interrupt ? window.app.api.interrupt() : fetch("/interrupt",
                                                                                          { method: "POST" }));
    await page.waitForFunction(() => window.fastarLive.ended.length > 0, null, { timeout: 120000 });
    result.frames_before_end = await shown();
    result.ended = await page.evaluate(() => window.fastarLive.ended);
    result.after_end = await page.evaluate(async (play) => (await fetch(`/fastar/live/${play}/keys`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ keys: ["d"] }) })).status,
    start.play);
  } else {
    let screenshot = null;
    for (const [key, frames] of keys) {
      const before = await page.evaluate(() => window.fastarLive.last);
      if (key) await page.keyboard.down(key);
      await waitFrames(frames);
      if (!screenshot && key && (result.holds.length === 1 || keys.length === 1)) { // mid-play: the second hold
        screenshot = path.join(out, "live_world_midplay.png");
        await page.screenshot({ path: screenshot, clip: box.clip });
      }
      if (key) await page.keyboard.up(key);
      result.holds.push({ key, from: before ? before.frame : null,
                          to: (await page.evaluate(() => window.fastarLive.last)).frame });
    }
    result.screenshot = screenshot;
    await page.waitForFunction(() => window.fastarLive.ended.length > 0, null, { timeout: 600000 });
    result.ended = await page.evaluate(() => window.fastarLive.ended);
  }
  result.recent = await page.evaluate(() => window.fastarLive.recent);
  result.sent = await page.evaluate(() => window.fastarLive.sent);
  result.frames_shown = await shown();
  await browser.close();
  console.log(JSON.stringify(result));
})().catch((e) => { console.log(JSON.stringify({ errors: [String(e && e.stack || e)] })); process.exit(0); });
