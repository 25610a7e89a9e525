// The LLM batch page's trend chart: fetches a workload's trend (/api/trend, same origin) and draws
// it as inline SVG, one panel per figure and one column per run, oldest on the left. No library,
// no external resource: the Airflow UI may run offline. Every mark has a <title> (a tooltip and
// a screen reader's text); the page's table beside the chart holds the same figures.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var WIDTH = 1000;
  var LEFT = 78;
  var RIGHT = 10;
  var TOP = 20;
  var BOTTOM = 18;
  var PANELS = [
    { key: "states", label: "Items by final state", height: 120 },
    { key: "cost_per_usable_result", label: "Cost per usable result", height: 64, kind: "money" },
    { key: "savings", label: "Savings against real-time prices", height: 64, kind: "money" },
    { key: "review_queue", label: "Review queue as the run left it", height: 64, kind: "count" },
    { key: "realtime_share", label: "Share sent through the real-time API", height: 64, kind: "share" }
  ];

  function node(name, attrs, parent) {
    var el = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    if (parent) { parent.appendChild(el); }
    return el;
  }

  function text(parent, x, y, value, anchor) {
    var el = node("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    el.textContent = value;
    return el;
  }

  function titled(el, value) {
    node("title", {}, el).textContent = value;
    return el;
  }

  function number(value) {
    if (value === null || value === undefined || value === "") { return null; }
    var n = Number(value);
    return isFinite(n) ? n : null;
  }

  function format(kind, value, currency) {
    if (value === null) { return "n/a"; }
    if (kind === "share") { return (value * 100).toFixed(1) + "%"; }
    if (kind === "count") { return value.toLocaleString("en-US"); }
    var abs = Math.abs(value);
    var places = abs === 0 || abs >= 1 ? 2 : abs >= 0.01 ? 4 : Math.max(4, 2 - Math.floor(Math.log10(abs)));
    var shown = abs.toFixed(places);
    var sign = value < 0 ? "-" : "";
    return currency === "USD" ? sign + "$" + shown : sign + shown + " " + currency;
  }

  function day(iso) {
    return iso ? iso.slice(0, 10) : "-";
  }

  function panel(host, spec, count) {
    var height = spec.height + TOP + BOTTOM;
    var svg = node("svg", {
      "class": "trend-panel",
      "data-metric": spec.key,
      viewBox: "0 0 " + WIDTH + " " + height,
      role: "img",
      "aria-label": spec.label + ", " + count + " runs"
    }, host);
    titled(svg, spec.label + ", " + count + " runs");
    text(svg, 0, 13, spec.label);
    node("line", { "class": "axis", x1: LEFT, x2: WIDTH - RIGHT, y1: TOP + spec.height, y2: TOP + spec.height }, svg);
    return svg;
  }

  function axis(svg, spec, low, high, label) {
    text(svg, LEFT - 6, TOP + 9, label(high), "end");
    text(svg, LEFT - 6, TOP + spec.height, label(low), "end");
  }

  function columns(count) {
    var step = (WIDTH - LEFT - RIGHT) / Math.max(count, 1);
    return { step: step, bar: Math.max(step * 0.8, 0.5) };
  }

  function dates(svg, spec, nights) {
    var y = TOP + spec.height + 14;
    text(svg, LEFT, y, day(nights[0].started_at));
    if (nights.length > 1) { text(svg, WIDTH - RIGHT, y, day(nights[nights.length - 1].started_at), "end"); }
  }

  function drawStates(svg, spec, data) {
    var nights = data.nights;
    var col = columns(nights.length);
    var most = 0;
    nights.forEach(function (n) { most = Math.max(most, n.items || 0); });
    axis(svg, spec, 0, most, function (v) { return v.toLocaleString("en-US"); });
    nights.forEach(function (n, i) {
      var g = node("g", { "class": "night", "data-run-id": n.run_id, "data-items": n.items === null ? "" : n.items }, svg);
      var x = LEFT + i * col.step + (col.step - col.bar) / 2;
      var parts = data.states.filter(function (s) { return n.states[s]; });
      var label = n.run_id + " (" + day(n.started_at) + "): " + (n.published
        ? parts.map(function (s) { return s + " " + n.states[s].toLocaleString("en-US"); }).join(", ") || "no items"
        : "not published");
      titled(g, label);
      var y = TOP + spec.height;
      parts.forEach(function (s) {
        var h = most ? spec.height * n.states[s] / most : 0;
        y -= h;
        var rect = node("rect", { x: x.toFixed(2), y: y.toFixed(2), width: col.bar.toFixed(2), height: h.toFixed(2),
          fill: data.colors[s] || "#495057", "data-state": s, "data-count": n.states[s] }, g);
        titled(rect, label);
      });
    });
    dates(svg, spec, nights);
  }

  function drawLine(svg, spec, data) {
    var nights = data.nights;
    var col = columns(nights.length);
    var values = nights.map(function (n) { return number(n[spec.key]); });
    var known = values.filter(function (v) { return v !== null; });
    var low = Math.min.apply(null, known.concat([0]));
    var high = Math.max.apply(null, known.concat([0]));
    if (high === low) { high = low + (spec.kind === "share" ? 1 : 1e-9); }
    axis(svg, spec, low, high, function (v) { return format(spec.kind, v, data.currency); });
    var path = "";
    var pen = "M";
    nights.forEach(function (n, i) {
      var v = values[i];
      var g = node("g", { "class": "night", "data-run-id": n.run_id, "data-value": n[spec.key] === null ? "" : n[spec.key] }, svg);
      var label = n.run_id + " (" + day(n.started_at) + "): " + spec.label.toLowerCase() + " " + format(spec.kind, v, data.currency);
      titled(g, label);
      if (v === null) { pen = "M"; return; }
      var x = LEFT + i * col.step + col.step / 2;
      var y = TOP + spec.height - spec.height * (v - low) / (high - low);
      path += pen + x.toFixed(2) + " " + y.toFixed(2) + " ";
      pen = "L";
      titled(node("circle", { "class": "dot", cx: x.toFixed(2), cy: y.toFixed(2), r: nights.length > 120 ? 1.5 : 3 }, g), label);
    });
    if (path) { svg.insertBefore(node("path", { "class": "line", d: path.trim() }), svg.querySelector("g.night")); }
    dates(svg, spec, nights);
  }

  function legend(host, data) {
    var list = document.createElement("ul");
    list.className = "legend";
    data.states.forEach(function (s) {
      var item = document.createElement("li");
      var swatch = document.createElement("i");
      swatch.style.background = data.colors[s] || "#495057";
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s));
      list.appendChild(item);
    });
    host.appendChild(list);
  }

  function draw(host, data) {
    if (!data.nights.length) {
      host.appendChild(document.createTextNode("No run of this workload to chart yet."));
      return;
    }
    PANELS.forEach(function (spec) {
      var svg = panel(host, spec, data.nights.length);
      if (spec.key === "states") {
        drawStates(svg, spec, data);
        legend(host, data);
      } else {
        drawLine(svg, spec, data);
      }
    });
  }

  function load(host) {
    host.setAttribute("data-chart", "loading");
    fetch(host.getAttribute("data-trend-src"), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (resp) {
        if (!resp.ok) { throw new Error("HTTP " + resp.status); }
        return resp.json();
      })
      .then(function (data) {
        draw(host, data);
        host.setAttribute("data-chart", "drawn");
      })
      .catch(function (err) {
        var p = document.createElement("p");
        p.className = "err";
        p.textContent = "The chart could not be drawn (" + err.message + "); the table below has every figure.";
        host.appendChild(p);
        host.setAttribute("data-chart", "failed");
      });
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-trend-src]"), load);
    Array.prototype.forEach.call(document.querySelectorAll("form.trend-pick select"), function (select) {
      select.addEventListener("change", function () { select.form.submit(); });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
