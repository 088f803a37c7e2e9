// gpuboot's graphs page: fetch the charts' data (same origin, the page's own query)
// and draw each chart as SVG: one line per GPU, time and value axes, a legend.
// Everything from the server is set as text or as numbers, never parsed as markup.
(function () {
  "use strict";
  var root = document.getElementById("graphs");
  var status = document.getElementById("status");
  var api = root.getAttribute("data-api");
  if (!api) { return; }
  var SVG = "http://www.w3.org/2000/svg";
  var W = 1300, H = 260, ML = 70, MR = 20, MT = 12, MB = 34;
  var COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var DASHES = ["", "6 3", "2 3", "8 3 2 3"];

  function svg(name, attrs, text) {
    var e = document.createElementNS(SVG, name);
    for (var k in attrs) { e.setAttribute(k, String(attrs[k])); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function html(name, cls, text) {
    var e = document.createElement(name);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function timeLabel(t, span) {
    var d = new Date(t * 1000);
    var hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    if (span <= 900) { return hm + ":" + pad(d.getUTCSeconds()); }
    if (span > 86400) { return pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + hm; }
    return hm;
  }
  function niceStep(top, n) {
    var raw = top / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * mag >= raw) { return steps[i] * mag; } }
    return 10 * mag;
  }
  function valueLabel(v) {
    if (Math.abs(v) >= 10000) { return (v / 1000).toFixed(0) + "k"; }
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  }

  function axes(g, data, top, xOf, yOf, unit) {
    var vstep = niceStep(top, 5);
    for (var v = 0; v <= top + 1e-9; v += vstep) {
      g.appendChild(svg("line", {"class": "grid", x1: ML, x2: W - MR, y1: yOf(v), y2: yOf(v)}));
      g.appendChild(svg("text", {x: ML - 6, y: yOf(v) + 4, "text-anchor": "end"}, valueLabel(v)));
    }
    g.appendChild(svg("text", {x: 12, y: MT + (H - MT - MB) / 2, transform: "rotate(-90 12 " + (MT + (H - MT - MB) / 2) + ")", "text-anchor": "middle"}, unit));
    var span = data.end - data.start;
    for (var i = 0; i <= 6; i++) {
      var t = data.start + span * i / 6;
      g.appendChild(svg("line", {"class": "grid", x1: xOf(t), x2: xOf(t), y1: MT, y2: H - MB}));
      g.appendChild(svg("text", {x: xOf(t), y: H - MB + 16, "text-anchor": i === 0 ? "start" : (i === 6 ? "end" : "middle")}, timeLabel(t, span)));
    }
    g.appendChild(svg("line", {"class": "axis", x1: ML, x2: ML, y1: MT, y2: H - MB}));
    g.appendChild(svg("line", {"class": "axis", x1: ML, x2: W - MR, y1: H - MB, y2: H - MB}));
  }

  // pathOf draws points as one path, broken where a point is missing (a gap of more
  // than two steps: the GPU was not scraped or not held).
  function pathOf(points, step, xOf, yOf) {
    var d = [], last = null;
    points.forEach(function (p) {
      var cmd = (last === null || p[0] - last > 2 * step) ? "M" : "L";
      d.push(cmd + xOf(p[0]).toFixed(1) + " " + yOf(p[1]).toFixed(1));
      last = p[0];
    });
    return d.join(" ");
  }

  function drawChart(data, chart) {
    var sec = html("section", "chart");
    sec.id = "chart-" + chart.id;
    sec.appendChild(html("h2", "", chart.title + " (" + chart.unit + ")"));
    var top = chart.max || 0;
    chart.lines.forEach(function (l) { l.points.forEach(function (p) { top = Math.max(top, p[1]); }); });
    if (!(top > 0)) { top = 1; }
    top = niceStep(top, 5) * Math.ceil(top / niceStep(top, 5));
    var xOf = function (t) { return ML + (t - data.start) / (data.end - data.start) * (W - ML - MR); };
    var yOf = function (v) { return H - MB - v / top * (H - MT - MB); };
    var s = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": chart.title, "data-chart": chart.id});
    axes(s, data, top, xOf, yOf, chart.unit);
    var legend = html("ul", "legend");
    var drawn = 0;
    chart.lines.forEach(function (l, i) {
      var colour = COLOURS[i % COLOURS.length], dash = DASHES[Math.floor(i / COLOURS.length) % DASHES.length];
      var attrs = {"class": "line", d: pathOf(l.points, data.step, xOf, yOf), stroke: colour, "data-points": l.points.length, "data-label": l.label};
      if (dash) { attrs["stroke-dasharray"] = dash; }
      if (l.simulated) { attrs["data-simulated"] = "true"; }
      var path = svg("path", attrs);
      path.appendChild(svg("title", {}, l.label + (l.uuid ? " " + l.uuid : "") + (l.simulated ? " (simulated)" : "")));
      if (l.points.length > 0) { s.appendChild(path); drawn++; }
      var li = html("li");
      var sw = svg("svg", {width: 12, height: 8});
      var swl = svg("line", {x1: 0, x2: 12, y1: 4, y2: 4, stroke: colour, "stroke-width": 3});
      if (dash) { swl.setAttribute("stroke-dasharray", dash); }
      sw.appendChild(swl);
      li.appendChild(sw);
      li.appendChild(document.createTextNode(" " + l.label + (l.uuid ? " · " + l.uuid.slice(0, 12) : "")));
      if (l.simulated) { li.appendChild(html("span", "sim", " · simulated")); }
      legend.appendChild(li);
    });
    if (drawn === 0) {
      s.appendChild(svg("text", {"class": "nodata", x: W / 2, y: H / 2, "text-anchor": "middle"}, "no data in this range"));
    }
    sec.appendChild(s);
    sec.appendChild(legend);
    return sec;
  }

  function show(data) {
    var frag = document.createDocumentFragment();
    data.charts.forEach(function (c) { frag.appendChild(drawChart(data, c)); });
    while (root.firstChild) { root.removeChild(root.firstChild); }
    root.appendChild(frag);
    var sims = data.charts.some(function (c) { return c.lines.some(function (l) { return l.simulated; }); });
    status.className = "";
    status.textContent = "Updated " + timeLabel(data.end, 0) + " UTC, a point every " + data.step + " s." +
      (sims ? " Lines marked simulated are the GPU simulator's, not hardware." : "") +
      (data.truncated ? " Some lines or points were left out (too many to draw)." : "");
  }

  function load() {
    fetch(api, {credentials: "same-origin", headers: {Accept: "application/json"}}).then(function (r) {
      return r.json().catch(function () { return {error: "HTTP " + r.status + " without a JSON answer"}; }).then(function (body) {
        if (!r.ok || body.error) { throw new Error(body.error || ("HTTP " + r.status)); }
        show(body);
      });
    }).catch(function (e) {
      status.className = "error";
      status.textContent = "No graphs: " + e.message;
    });
  }
  load();
  setInterval(load, 30000);
})();
