// The console's terminal (docs/console.md, Terminal): xterm.js on the
// remote session's WebSocket. Binary messages are the pty's bytes both
// ways; text messages are the relay's JSON controls (package remote).
(function () {
  "use strict";
  var el = document.getElementById("terminal");
  if (!el || !window.Terminal) return;
  var status = document.getElementById("terminal-status");
  // xterm.js adds <style> elements for its cells; the page's policy
  // admits those that carry its nonce.
  var nonce = el.getAttribute("data-style-nonce");
  var create = document.createElement.bind(document);
  document.createElement = function (tag, options) {
    var e = create(tag, options);
    if (String(tag).toLowerCase() === "style") e.nonce = nonce;
    return e;
  };
  var term = new window.Terminal({ cols: 100, rows: 30, cursorBlink: true, scrollback: 5000 });
  term.open(el);
  var ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + el.getAttribute("data-socket"));
  ws.binaryType = "arraybuffer";
  var encoder = new TextEncoder();
  var ended = "";
  function send(data) { if (ws.readyState === WebSocket.OPEN) ws.send(data); }
  function resize() { send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows })); }
  ws.onopen = function () {
    status.textContent = "Connected.";
    resize();
    term.focus();
  };
  ws.onmessage = function (ev) {
    if (typeof ev.data !== "string") {
      term.write(new Uint8Array(ev.data));
      return;
    }
    var m;
    try { m = JSON.parse(ev.data); } catch (e) { return; }
    if (m.type === "exit") ended = "The shell exited with status " + m.code + ".";
    else if (m.type === "error") ended = m.message.charAt(0).toUpperCase() + m.message.slice(1) + ".";
  };
  ws.onclose = function () {
    status.textContent = ended || "The session ended.";
    term.options.disableStdin = true;
    term.options.cursorBlink = false;
  };
  term.onData(function (d) { send(encoder.encode(d)); });
  term.onBinary(function (d) {
    var b = new Uint8Array(d.length);
    for (var i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 255;
    send(b);
  });
  term.onResize(resize);
})();
