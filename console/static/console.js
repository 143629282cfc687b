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
    root.querySelectorAll("[data-when]").forEach(function (el) {
      el.hidden = el.getAttribute("data-when").split(" ").indexOf(data.status) < 0;
    });
    root.querySelectorAll("[data-triggered]").forEach(function (el) {
      var i = Number(el.getAttribute("data-triggered"));
      var word = (data.triggered || [])[i] ? "released" : (data.next_phase === i ? "next" : "waiting");
      setText(el, word);
    });
  }

  function applyOverview(root, data) {
    ["devices", "in_flight", "alerts"].forEach(function (k) {
      root.querySelectorAll('[data-live="' + k + '"]').forEach(function (el) { setText(el, data[k]); });
    });
    document.querySelectorAll("tr[data-action]").forEach(function (row) {
      var counts = (data.actions || {})[row.getAttribute("data-action")];
      if (!counts) return;
      row.querySelectorAll('[data-live="Completed"],[data-live="Failed"]').forEach(function (el) {
        setText(el, counts[el.getAttribute("data-live")] || 0);
      });
      row.querySelectorAll('progress[data-live="final"]').forEach(function (el) {
        el.max = Math.max(total(counts), 1);
        el.value = finished(counts);
      });
    });
  }

  function connect(root) {
    var src = root.getAttribute("data-live-source");
    var event = root.getAttribute("data-live-event") || "overview";
    var es = new EventSource(src);
    es.addEventListener(event, function (e) {
      var data = JSON.parse(e.data);
      if (event === "action") applyAction(root, data); else applyOverview(document, data);
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

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live-source]").forEach(connect);
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
