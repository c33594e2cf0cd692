/* The admin console's behaviour (no inline script: the page's CSP forbids it).
   - [data-plot=ID]: draws the JSON of <script type="application/json" id=ID> with uPlot:
     {x: [epoch s], series: [{label, values}], stacked?: bool}.
   - [data-refresh=URL][data-every=S]: replaces the element's content with GET URL's fragment
     every S seconds (header X-Console-Fragment: 1); a 401 sends the browser to sign in.
   - [data-copy=ID]: copies the text of #ID to the clipboard.
   - form[data-confirm]: asks before submitting. */
(function () {
  "use strict";
  var palette = ["#2f6fde", "#e0582b", "#2f9e5b", "#a855c7", "#c79a16", "#17a2b8", "#d6336c", "#6c757d", "#8d6e63"];

  function stack(series) {
    var sums = null;
    return series.map(function (s) {
      var values = s.values.map(function (v, i) {
        var below = sums ? sums[i] : 0;
        return (v || 0) + below;
      });
      sums = values;
      return { label: s.label, values: values };
    });
  }

  // Axis labels that stay readable for small values (costs) and large ones (tokens).
  function ticks(u, values) {
    return values.map(function (v) {
      if (v === null || v === undefined) return "";
      if (v !== 0 && Math.abs(v) < 1) return v.toPrecision(2);
      if (Math.abs(v) >= 1e6) return (v / 1e6).toLocaleString() + "M";
      return v.toLocaleString();
    });
  }

  // Whether a series has a value with no value beside it: uPlot draws no line through a lone
  // point, so such a series shows its points.
  function isolated(values) {
    return values.some(function (v, i) {
      var none = function (j) { return j < 0 || j >= values.length || values[j] === null; };
      return v !== null && none(i - 1) && none(i + 1);
    });
  }

  function draw(el) {
    var source = document.getElementById(el.getAttribute("data-plot"));
    if (!source || typeof uPlot === "undefined") return;
    var data = JSON.parse(source.textContent);
    // Stacked: each series is drawn at its running sum, and the band between it and the one
    // below is filled, so the legend keeps the table's order (the first group at the bottom).
    var series = data.stacked ? stack(data.series) : data.series;
    var width = Math.max(260, el.clientWidth || 600);
    var opts = {
      width: width,
      height: 220,
      series: [{}].concat(series.map(function (s, i) {
        var color = palette[i % palette.length];
        var line = { label: s.label, stroke: color, width: 2, spanGaps: false };
        if (data.stacked && i === 0) line.fill = color + "55";
        if (!data.stacked && isolated(s.values)) line.points = { show: true, size: 7, fill: color };
        return line;
      })),
      axes: [{ stroke: "currentColor" }, { stroke: "currentColor", size: 60, values: ticks }],
      scales: { x: { time: true } }
    };
    if (data.stacked) {
      opts.bands = series.slice(1).map(function (s, i) {
        return { series: [i + 2, i + 1], fill: palette[(i + 1) % palette.length] + "55" };
      });
    }
    var columns = [data.x].concat(series.map(function (s) { return s.values; }));
    el.textContent = "";
    var plot = new uPlot(opts, columns, el);
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () {
        plot.setSize({ width: Math.max(260, el.clientWidth), height: 220 });
      }, 150);
    });
  }

  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var every = Math.max(1, parseInt(el.getAttribute("data-every"), 10) || 5) * 1000;
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
        .then(function (r) {
          if (r.status === 401) { window.location.assign("/admin/ui/login"); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (text) {
          if (text !== null) {
            var doc = new DOMParser().parseFromString(text, "text/html");
            el.replaceChildren.apply(el, Array.prototype.slice.call(doc.body.childNodes));
          }
        })
        .catch(function () { /* the next tick tries again */ })
        .then(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }

  function copy(button) {
    var target = document.getElementById(button.getAttribute("data-copy"));
    var note = document.querySelector('[data-copied="' + button.getAttribute("data-copy") + '"]');
    var text = target ? target.textContent : "";
    var done = function () { if (note) note.textContent = "Copied."; };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(done, function () {
        if (note) note.textContent = "Select the text and copy it.";
      });
    } else if (note) {
      note.textContent = "Select the text and copy it.";
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-plot]").forEach(draw);
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("[data-copy]").forEach(function (b) {
      b.addEventListener("click", function () { copy(b); });
    });
    document.querySelectorAll("form[data-confirm]").forEach(function (f) {
      f.addEventListener("submit", function (event) {
        if (!window.confirm(f.getAttribute("data-confirm"))) event.preventDefault();
      });
    });
  });
})();
