// fleetd console: live updates by server-sent events. Everything a device
// or a person supplied is set with textContent, never parsed as HTML.
"use strict";

(function () {
  var finalStatuses = ["Completed", "Failed", "Cancelled"];

  function total(counts) {
    var n = 0;
    for (var k in counts) n += counts[k];
    return n;
  }
  function finished(counts) {
    var n = 0;
    finalStatuses.forEach(function (s) { n += counts[s] || 0; });
    return n;
  }
  function countsFor(data, el) {
    var phase = el.getAttribute("data-phase");
    if (phase === null) return data.statuses || {};
    return (data.phased || {})[phase] || {};
  }
  function setText(el, text) {
    if (el.textContent !== String(text)) el.textContent = String(text);
  }

  function applyCounts(root, pick) {
    root.querySelectorAll("[data-count]").forEach(function (el) {
      setText(el, pick(el)[el.getAttribute("data-count")] || 0);
    });
    root.querySelectorAll("progress[data-progress]").forEach(function (el) {
      var c = pick(el);
      el.max = Math.max(total(c), 1);
      el.value = finished(c);
      setText(el, Math.floor(100 * el.value / el.max) + "%");
    });
    root.querySelectorAll("[data-percent]").forEach(function (el) {
      var c = pick(el), t = total(c);
      setText(el, t ? Math.floor(100 * finished(c) / t) : 0);
    });
  }

  function applyAction(root, data) {
    applyCounts(root, function (el) { return countsFor(data, el); });
    root.querySelectorAll("[data-rollout-status]").forEach(function (el) {
      setText(el, data.status || "");
      el.className = "rollout r-" + (data.status || "");
    });
    root.querySelectorAll("[data-pause-reason]").forEach(function (el) {
      setText(el, data.pause_reason || "");
      el.hidden = !data.pause_reason;
    });
    root.querySelectorAll("[data-waiting-reason]").forEach(function (el) {
      setText(el, data.waiting_reason || "");
      el.hidden = !data.waiting_reason;
    });
    root.querySelectorAll("[data-op]").forEach(function (el) {
      el.hidden = (data.ops || []).indexOf(el.getAttribute("data-op")) < 0;
    });
    root.querySelectorAll("[data-confirm-for]").forEach(function (el) {
      var text = (data.confirm || {})[el.getAttribute("data-confirm-for")];
      if (text) el.setAttribute("data-confirm", text);
    });
    var stopped = data.status === "aborted";
    root.querySelectorAll("[data-finished-line]").forEach(function (el) { el.hidden = stopped; });
    root.querySelectorAll("[data-aborted-line]").forEach(function (el) { el.hidden = !stopped; });
    root.querySelectorAll("progress[data-progress]").forEach(function (el) { el.classList.toggle("stopped", stopped); });
    root.querySelectorAll("[data-triggered]").forEach(function (el) {
      var i = Number(el.getAttribute("data-triggered"));
      var word = (data.triggered || [])[i] ? "released" : (data.next_phase === i ? "next" : "waiting");
      setText(el, word);
    });
  }

  // el makes an element with text, attributes and children: never HTML.
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    (children || []).forEach(function (c) {
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
    return e;
  }
  function link(href, text) { return el("a", { href: href }, [text]); }
  function td(children, attrs) { return el("td", attrs, children); }

  function actionCounts(row, counts) {
    var t = total(counts), f = finished(counts), pct = t ? Math.floor(100 * f / t) : 0;
    var bar = row.querySelector("progress");
    bar.max = Math.max(t, 1);
    bar.value = f;
    setText(bar, pct + "%");
    var cells = { percent: pct, running: (counts.Initiated || 0) + (counts.Progress || 0),
      completed: counts.Completed || 0, failed: counts.Failed || 0 };
    row.querySelectorAll("[data-cell]").forEach(function (c) { setText(c, cells[c.getAttribute("data-cell")]); });
  }
  function actionRow(a) {
    var name = [link("/console/actions/" + a.id, "#" + a.id + " " + a.action)];
    if (a.rollout) name.push(" ", el("span", { "class": "rollout r-" + a.rollout }, [a.rollout]));
    var row = el("tr", { "data-action": a.id }, [
      td(name),
      td([el("progress", { max: 1, value: 0, "aria-label": "action " + a.id + " finished" }), " ", el("span", { "data-cell": "percent" }), "%"]),
      td([], { "data-cell": "running" }), td([], { "data-cell": "completed" }), td([], { "data-cell": "failed" }),
      td([a.started]),
    ]);
    actionCounts(row, a.statuses || {});
    return row;
  }
  function alertRow(a) {
    return el("tr", {}, [td([a.rule]), td([link("/console/devices/" + encodeURIComponent(a.device), a.device)]), td([a.stream]), td([a.since])]);
  }
  function failureRow(f) {
    return el("tr", {}, [td([link("/console/actions/" + f.action_id, "#" + f.action_id + " " + f.type)]),
      td([link("/console/devices/" + encodeURIComponent(f.device), f.device)]), td([f.errors]), td([f.at])]);
  }

  // rows shows a list: the rows are made again only when the list changed
  // (so a focused link stays put while numbers move); same tells whether a
  // row shown is an item's, update refreshes it in place.
  var shown = {};
  function rows(root, name, items, make, key, update) {
    var table = root.querySelector('[data-rows="' + name + '"]');
    var empty = root.querySelector('[data-empty="' + name + '"]');
    if (!table) return;
    items = items || [];
    table.hidden = items.length === 0;
    if (empty) empty.hidden = items.length !== 0;
    var body = table.tBodies[0];
    var keys = JSON.stringify(items.map(key));
    if (shown[name] === undefined) {
      shown[name] = JSON.stringify(Array.prototype.map.call(body.rows, function (r) { return r.getAttribute("data-key"); }));
    }
    if (keys === shown[name] && update) {
      items.forEach(function (it, i) { update(body.rows[i], it); });
      return;
    }
    if (keys === shown[name]) return;
    var fresh = document.createElement("tbody");
    items.forEach(function (it) {
      var r = make(it);
      r.setAttribute("data-key", key(it));
      fresh.appendChild(r);
    });
    table.replaceChild(fresh, body);
    shown[name] = keys;
  }

  function applyOverview(root, data) {
    ["devices", "online", "in_flight", "alerts"].forEach(function (k) {
      if (data[k] === undefined) return;
      root.querySelectorAll('[data-live="' + k + '"]').forEach(function (e) { setText(e, data[k]); });
    });
    root.querySelectorAll("[data-live-warn]").forEach(function (e) { e.classList.toggle("warn", data.alerts > 0); });
    rows(root, "actions", data.actions, actionRow, function (a) { return String(a.id); },
      function (row, a) { actionCounts(row, a.statuses || {}); });
    rows(root, "alerts", data.active_alerts, alertRow, function (a) { return JSON.stringify(a); });
    rows(root, "failures", data.failures, failureRow, function (f) { return JSON.stringify(f); });
  }

  function connect(root) {
    var src = root.getAttribute("data-live-source");
    var event = root.getAttribute("data-live-event") || "overview";
    var es = new EventSource(src);
    es.addEventListener(event, function (e) {
      var data = JSON.parse(e.data);
      if (event === "action") applyAction(root, data); else applyOverview(root, data);
      document.body.setAttribute("data-live-updated", String(Date.now()));
    });
  }

  // Charts are drawn by the server; an event carries each chart's new
  // geometry and text, which are set on the same SVG elements. A field
  // that appears gets a copy of the page's blank chart.
  function drawChart(fig, c) {
    setText(fig.querySelector("[data-chart-title]"), c.title);
    setText(fig.querySelector("[data-chart-summary]"), c.summary);
    fig.querySelector("svg").setAttribute("aria-label", c.title + ": " + c.summary);
    fig.querySelector("path.line").setAttribute("d", c.line);
    fig.querySelector("path.band").setAttribute("d", c.band);
    var grid = fig.querySelectorAll("line.grid"), ys = fig.querySelectorAll("text.ylabel"), xs = fig.querySelectorAll("text.xlabel");
    (c.y || []).forEach(function (t, i) {
      if (grid[i]) { grid[i].setAttribute("y1", t.pos); grid[i].setAttribute("y2", t.pos); }
      if (ys[i]) { ys[i].setAttribute("y", t.pos); setText(ys[i], t.label); }
    });
    (c.x || []).forEach(function (t, i) {
      if (xs[i]) { xs[i].setAttribute("x", t.pos); setText(xs[i], t.label); }
    });
    fig.querySelector("[data-chart-nodata]").toggleAttribute("hidden", !c.empty);
  }
  function applyCharts(root, data) {
    var box = root.querySelector("[data-charts]");
    var blank = root.querySelector("template[data-chart-template]");
    var figs = {};
    box.querySelectorAll("[data-chart]").forEach(function (f) { figs[f.getAttribute("data-chart")] = f; });
    (data.charts || []).forEach(function (c) {
      var fig = figs[c.key];
      if (!fig) {
        fig = blank.content.firstElementChild.cloneNode(true);
        fig.setAttribute("data-chart", c.key);
        box.appendChild(fig);
      }
      drawChart(fig, c);
    });
    var empty = root.querySelector("[data-charts-empty]");
    if (empty && (data.charts || []).length) empty.hidden = true;
  }

  // The Logs tab adds each line that arrives at the top of its table,
  // keeping at most data-log-max lines.
  function followLogs(root) {
    var table = root.querySelector("[data-logs]");
    var empty = root.querySelector("[data-logs-empty]");
    var most = Number(root.getAttribute("data-log-max")) || 1000;
    var es = new EventSource(root.getAttribute("data-log-source"));
    es.addEventListener("log", function (e) {
      var l = JSON.parse(e.data);
      var msg = [l.message];
      if (l.line) msg.push(" ", el("span", { "class": "count" }, [l.line]));
      var when = new Date(l.timestamp).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
      var row = el("tr", { "data-live-line": "" }, [td([when], { "class": "mono" }),
        td([l.level], { "class": "level l-" + l.level }), td([l.tag]), td(msg)]);
      var body = table.tBodies[0];
      body.insertBefore(row, body.firstChild);
      while (body.rows.length > most) body.deleteRow(-1);
      table.hidden = false;
      if (empty) empty.hidden = true;
      document.body.setAttribute("data-live-updated", String(Date.now()));
    });
  }

  // upload sends a file form with XMLHttpRequest to show its progress;
  // the server's answer replaces the page (its redirect is followed).
  function upload(form) {
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var bar = form.querySelector("[data-upload-progress]");
      var status = form.querySelector("[data-upload-status]");
      var xhr = new XMLHttpRequest();
      xhr.open("POST", form.action);
      xhr.upload.addEventListener("progress", function (p) {
        if (!p.lengthComputable) return;
        bar.hidden = false;
        bar.max = p.total;
        bar.value = p.loaded;
        setText(status, Math.floor(100 * p.loaded / p.total) + "% sent");
      });
      xhr.addEventListener("load", function () {
        if (xhr.status < 400) {
          window.location.assign(xhr.responseURL);
          return;
        }
        var doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
        var err = doc.querySelector(".error");
        setText(status, err ? err.textContent.trim() : "The upload failed (" + xhr.status + ").");
      });
      xhr.addEventListener("error", function () { setText(status, "The upload failed: the connection broke."); });
      xhr.send(new FormData(form));
    });
  }

  // The rule editor's threshold builder writes {"field", "operator",
  // "value"} into the condition's JSON field as its controls change, and
  // shows a condition of that form typed there. It only fills the field:
  // the server reads and validates the JSON as the API does.
  function conditionBuilder(fs) {
    var json = document.getElementById(fs.getAttribute("data-condition-builder"));
    var field = fs.querySelector('[data-builder="field"]');
    var op = fs.querySelector('[data-builder="operator"]');
    var value = fs.querySelector('[data-builder="value"]');
    var status = fs.querySelector("[data-builder-status]");
    var operators = [].map.call(op.options, function (o) { return o.value; });
    // A value as typed: JSON's number, true, false or "text", else text.
    function valueOf(s) {
      try {
        var v = JSON.parse(s);
        if (typeof v === "number" || typeof v === "boolean" || typeof v === "string") return v;
      } catch (e) { /* text */ }
      return s;
    }
    function show() {
      var c;
      try { c = JSON.parse(json.value); } catch (e) { return; }
      if (!c || typeof c !== "object" || Object.keys(c).sort().join() !== "field,operator,value" ||
          typeof c.field !== "string" || operators.indexOf(c.operator) < 0 || typeof c.value === "object") return;
      field.value = c.field;
      op.value = c.operator;
      value.value = typeof c.value === "string" && valueOf(c.value) === c.value ? c.value : JSON.stringify(c.value);
    }
    function fill() {
      if (field.value.trim() === "" || value.value.trim() === "") return;
      var c = { field: field.value.trim(), operator: op.value, value: valueOf(value.value.trim()) };
      json.value = JSON.stringify(c, null, 2);
      setText(status, "The condition now reads " + JSON.stringify(c) + ".");
    }
    field.addEventListener("input", fill);
    value.addEventListener("input", fill);
    op.addEventListener("change", fill);
    json.addEventListener("input", show);
    show();
    fs.hidden = false;
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-condition-builder]").forEach(conditionBuilder);
    document.querySelectorAll("[data-live-source]").forEach(connect);
    document.querySelectorAll("[data-chart-source]").forEach(function (root) {
      new EventSource(root.getAttribute("data-chart-source")).addEventListener("charts", function (e) {
        applyCharts(root, JSON.parse(e.data));
        document.body.setAttribute("data-live-updated", String(Date.now()));
      });
    });
    document.querySelectorAll("[data-log-source]").forEach(followLogs);
    document.querySelectorAll("form[data-upload]").forEach(upload);
    // A form that deletes asks first.
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (e) {
        if (!window.confirm(form.getAttribute("data-confirm"))) e.preventDefault();
      });
    });
    // A page that shows a secret once answers a POST: its history entry
    // becomes the plain page's, so a reload or Back fetches that (without
    // the secret) instead of offering to send the form again.
    document.querySelectorAll("[data-shown-once]").forEach(function (el) {
      window.history.replaceState(null, "", el.getAttribute("data-shown-once"));
    });
  });
})();
