// Drive the `fastar play` page in headless Chromium (playwright-core, Debian's chromium): hold each steering key,
// and report how the camera moved on the page, whether the true view shifted the way the key says, how many frames
// were drawn, and what the mode switch did. Prints one JSON line.
//
//   NODE_PATH=<folder with playwright-core> node press_keys.cjs http://127.0.0.1:PORT /usr/bin/chromium
"use strict";
const { chromium } = require("playwright-core");

const [base, executablePath] = process.argv.slice(2);
const MOVES = { ArrowRight: [1, 0, "right"], ArrowDown: [0, 1, "down"], a: [-1, 0, "left"], w: [0, -1, "up"] };
const STEP = 4;

(async () => {
  const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu", "--no-first-run"] });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e.message)));
  await page.goto(base, { waitUntil: "load" });
  await page.waitForFunction(() => window.fastarPlay.frames > 3, null, { timeout: 60000 });
  const moves = {};
  // A frame drawn after the key's move ended (the page may lag the keys by the frames it still has queued).
  const settle = () => page.waitForFunction(() => window.fastarPlay.last.action === "none", null, { timeout: 60000 });
  await settle();
  for (const [key, [dx, dy, expected]] of Object.entries(MOVES)) {
    const before = await page.evaluate(() => window.fastarPlay.last);
    await page.keyboard.down(key);
    // Two consecutive frames drawn while the key is held, with the true view's pixels of each.
    const pair = await page.evaluate(async (expected) => {
      const grab = () => { const c = document.getElementById("truth");
                           return Array.from(c.getContext("2d").getImageData(0, 0, 24, 24).data); };
      const next = async (after) => { for (let i = 0; i < 4000; i++) {
        const l = window.fastarPlay.last; if (l && l.index > after) return { ...l, px: grab() };
        await new Promise((r) => setTimeout(r, 2)); } return null; };
      for (let tries = 0; tries < 200; tries++) {
        const a = await next(window.fastarPlay.last.index);
        const b = a && await next(a.index);
        if (a && b && b.index === a.index + 1 && a.action === expected && b.action === expected) return [a, b];
      }
      return null;
    }, expected);
    await page.waitForTimeout(200);
    await page.keyboard.up(key);
    await settle();
    const after = await page.evaluate(() => window.fastarPlay.last);
    const wrap = (d) => ((d + 36) % 24) - 12;  // the map is 24 patches a side
    let matches = false;
    if (pair) {  // the later view, moved back by the camera step, equals the earlier one where both see the map
      const [a, b] = pair; matches = true;
      for (let y = 0; y < 24; y++) for (let x = 0; x < 24; x++) {
        const sx = x - dx * STEP, sy = y - dy * STEP;
        if (sx < 0 || sy < 0 || sx >= 24 || sy >= 24) continue;
        for (let ch = 0; ch < 3; ch++) if (b.px[4 * (sy * 24 + sx) + ch] !== a.px[4 * (y * 24 + x) + ch]) matches = false;
      }
    }
    moves[key] = { action: pair ? pair[0].action : null, dx: wrap(after.x - before.x), dy: wrap(after.y - before.y),
                   truth_shift_matches: matches };
  }
  await page.click("#mode-dense");
  await page.waitForFunction(() => window.fastarPlay.last && window.fastarPlay.last.mode === "dense", null,
                             { timeout: 60000 });
  const result = { errors, moves, frames_shown: await page.evaluate(() => window.fastarPlay.frames),
                   mode_after_switch: (await page.evaluate(() => window.fastarPlay.last)).mode };
  await browser.close();
  console.log(JSON.stringify(result));
})().catch((e) => { console.log(JSON.stringify({ errors: [String(e)], moves: {}, frames_shown: 0 })); process.exit(0); });
