// Opens the chat page in headless Chromium (DevTools protocol over --remote-debugging-pipe, no npm
// packages), lets it send one message (?q=...), and waits until the streamed answer is complete.
// Usage: node chromium_page.mjs CHROMIUM URL USER_DATA_DIR
// Prints one line "RESULT {done, chunks, content, error, partial}" (JSON) where `partial` says a poll saw the
// answer while it was still streaming. Exits 1 on timeout.
import { spawn } from "node:child_process";

const [browser, url, userDir] = process.argv.slice(2);
const chrome = spawn(browser, [
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
  "--disable-sync", "--no-first-run", `--user-data-dir=${userDir}`, "--remote-debugging-pipe", "about:blank",
], { stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"] });
const toChrome = chrome.stdio[3], fromChrome = chrome.stdio[4];
// stdout is a pipe: process.exit() right after an asynchronous write can cut the line short, so exit
// from the write's callback.
let finished = false;
const done = (code, line) => {
  if (finished) return;
  finished = true;
  chrome.kill("SIGKILL");
  process.stdout.write((line || "") + "\n", () => process.exit(code));
};
setTimeout(() => done(1, "RESULT " + JSON.stringify({ error: "timeout" })), 60_000);

let nextId = 0, buf = Buffer.alloc(0);
const waiting = new Map();
fromChrome.on("data", (d) => {
  buf = Buffer.concat([buf, d]);
  let i;
  while ((i = buf.indexOf(0)) >= 0) {
    const msg = JSON.parse(buf.subarray(0, i).toString());
    buf = buf.subarray(i + 1);
    if (msg.id && waiting.has(msg.id)) { waiting.get(msg.id)(msg); waiting.delete(msg.id); }
  }
});
const send = (method, params = {}, sessionId) => new Promise((resolve) => {
  const m = { id: ++nextId, method, params };
  if (sessionId) m.sessionId = sessionId;
  waiting.set(m.id, resolve);
  toChrome.write(JSON.stringify(m) + "\0");
});

const { result: { targetId } } = await send("Target.createTarget", { url });
const { result: { sessionId } } = await send("Target.attachToTarget", { targetId, flatten: true });
const probe = `(() => {
  const a = document.querySelector(".msg.assistant");
  if (!a) return null;
  return { done: a.dataset.done === "1", chunks: Number(a.dataset.chunks || 0),
           content: a.querySelector(".content").textContent, error: a.classList.contains("error") };
})()`;
let partial = false;
for (;;) {
  const r = await send("Runtime.evaluate", { expression: probe, returnByValue: true }, sessionId);
  const v = r.result && r.result.result && r.result.result.value;
  if (v && !v.done && v.content.length > 0) partial = true;
  if (v && v.done) {
    done(0, "RESULT " + JSON.stringify({ ...v, partial }));
    break;
  }
  await new Promise((res) => setTimeout(res, 20));
}
