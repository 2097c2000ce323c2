// otel-verl viewer: one page, hash routes, DOM built with createElement/textContent only
// (text from the store is never parsed as HTML). Works against the local server's JSON API, or
// offline inside a report (the same answers embedded in #otel-verl-data).
(() => {
  'use strict';

  const dataEl = document.getElementById('otel-verl-data');
  const REPORT = dataEl ? JSON.parse(dataEl.textContent) : null;
  const PLOTLY = typeof window.Plotly !== 'undefined' ? window.Plotly : null;
  const app = document.getElementById('app');
  let generation = -1;
  let currentRoute = '';

  // ---------------------------------------------------------------------------------------------
  // DOM helpers
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = String(value);
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else if (key === 'dataset') Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const scroll = (table) => h('div', {class: 'scroll'}, table);
  const link = (href, text, attrs) => h('a', Object.assign({href}, attrs || {}), text);
  const testid = (id) => ({'data-testid': id});

  function fmt(value, digits) {
    if (value === null || value === undefined || value === '') return '–';
    if (typeof value === 'boolean') return value ? 'yes' : 'no';
    if (typeof value === 'number') {
      if (Number.isInteger(value)) return String(value);
      return value.toFixed(digits === undefined ? 3 : digits);
    }
    return String(value);
  }
  function pct(value) {
    return value === null || value === undefined ? '–' : (100 * value).toFixed(1) + '%';
  }
  function dur(ns) {
    if (ns === null || ns === undefined) return '–';
    if (ns < 1e6) return (ns / 1e3).toFixed(0) + ' µs';
    if (ns < 1e9) return (ns / 1e6).toFixed(1) + ' ms';
    const s = ns / 1e9;
    if (s < 60) return s.toFixed(2) + ' s';
    return Math.floor(s / 60) + 'm' + (s % 60).toFixed(1).padStart(4, '0') + 's';
  }
  function pretty(value) {
    if (value === null || value === undefined) return '';
    if (typeof value !== 'string') return JSON.stringify(value, null, 2);
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch (e) { return value; }
  }
  const split = (validate) => validate === true ? 'validation' : validate === false ? 'training' : '–';
  const short = (id) => (id || '').slice(0, 12);

  // ---------------------------------------------------------------------------------------------
  // routes and data
  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, '');
    const [name, query] = raw.split('?');
    return {name: name || 'overview', params: Object.fromEntries(new URLSearchParams(query || ''))};
  }
  function href(name, params) {
    const clean = Object.fromEntries(Object.entries(params || {}).filter(
      ([, v]) => v !== null && v !== undefined && v !== ''));
    const q = new URLSearchParams(clean).toString();
    return '#/' + name + (q ? '?' + q : '');
  }
  const boolParam = (v) => v === 'true' || v === '1' ? true : v === 'false' || v === '0' ? false : null;
  const numParam = (v) => v === undefined || v === null || v === '' || isNaN(Number(v)) ? null : Number(v);

  async function api(route, params) {
    if (REPORT) return localApi(route, params || {});
    const clean = Object.fromEntries(Object.entries(params || {}).filter(
      ([, v]) => v !== null && v !== undefined && v !== ''));
    const response = await fetch('api/' + route + '?' + new URLSearchParams(clean));
    if (response.status === 404) return null;
    if (response.status === 400) {  // a filter out of range: the server names it
      const body = await response.json().catch(() => ({}));
      throw new Error(route + ': ' + (body.error || 'bad request'));
    }
    if (!response.ok) throw new Error(route + ': HTTP ' + response.status);
    return response.json();
  }

  // the report's answers: the server's, computed here over the embedded rows
  function filterRows(rows, p) {
    const eq = (key, want) => want === null || want === undefined || want === '' ? () => true
      : (r) => r[key] === want;
    const tests = [
      eq('experiment', p.experiment || null), eq('step', numParam(p.step)),
      eq('sample_index', numParam(p.sample_index)), eq('rollout_n', numParam(p.rollout_n)),
      eq('validate', boolParam(p.validate)),
    ];
    const lo = numParam(p.reward_min), hi = numParam(p.reward_max);
    if (lo !== null) tests.push((r) => r.reward !== null && r.reward >= lo);
    if (hi !== null) tests.push((r) => r.reward !== null && r.reward <= hi);
    if (boolParam(p.errors)) tests.push((r) => r.errors > 0 || r.tool_errors > 0);
    if (p.text) {
      const needle = p.text.toLowerCase();
      tests.push((r) => [r.prompt, r.response, r.error, r.search].some(
        (t) => t && t.toLowerCase().includes(needle)));
    }
    if (p.trace) tests.push((r) => r.trace_id.startsWith(p.trace.toLowerCase()));
    return rows.filter((r) => tests.every((t) => t(r)));
  }
  function sortRows(rows, order, desc) {
    const key = order || 'start_ns';
    const sign = desc ? -1 : 1;
    return rows.slice().sort((a, b) => {
      const x = a[key], y = b[key];
      if (x === null && y === null) return a.key < b.key ? -1 : 1;
      if (x === null) return 1;
      if (y === null) return -1;
      if (x < y) return -sign;
      if (x > y) return sign;
      return a.key < b.key ? -1 : 1;
    });
  }
  function localApi(route, p) {
    const rows = REPORT.rows;
    if (route === 'meta') return REPORT.meta;
    if (route === 'overview') {
      const keep = (s) => !p.experiment || s.experiment === p.experiment;
      return {steps: REPORT.overview.steps.filter(keep), flat: REPORT.overview.flat.filter(keep)};
    }
    if (route === 'trajectories') {
      const found = sortRows(filterRows(rows, p), p.order, boolParam(p.desc));
      const size = numParam(p.page_size) || 50, page = numParam(p.page) || 0;
      return {total: found.length, page, page_size: size,
        rows: found.slice(page * size, page * size + size)};
    }
    if (route === 'trajectory') {
      const detail = REPORT.details[p.key];
      if (detail) return detail;
      const row = rows.find((r) => r.key === p.key);
      return row ? {row, missing: 'this trajectory\'s details are not included in the report ' +
        '(otel-verl report --max-details N includes more)'} : null;
    }
    if (route === 'group') {
      const found = sortRows(filterRows(rows, {experiment: p.experiment, step: p.step,
        sample_index: p.sample_index, validate: p.validate}), 'rollout_n');
      const details = {};
      for (const r of found) if (REPORT.details[r.key]) details[r.key] = REPORT.details[r.key];
      return {rows: found, total: found.length, details};
    }
    if (route === 'prompt') {
      const found = sortRows(filterRows(rows, {experiment: p.experiment,
        sample_index: p.sample_index, validate: p.validate}), 'step');
      return {rows: found, total: found.length};
    }
    return null;
  }

  // ---------------------------------------------------------------------------------------------
  // charts (plotly when available; every chart also has its numbers in a table next to it)
  function stepAxis(steps) {
    const lo = Math.min(...steps), hi = Math.max(...steps);
    return {tickformat: 'd', dtick: Math.max(1, Math.ceil((hi - lo) / 10)), tick0: lo};
  }
  function chart(id, traces, layout) {
    const box = h('div', Object.assign({class: 'chart', id}, testid(id)));
    if (!PLOTLY) {
      box.append(h('p', {class: 'muted'}, 'charts need plotly (pip install "otel-verl[ui]"); ' +
        'the numbers are in the table below'));
      return box;
    }
    // the title sits on the left and the toolbar (Plotly's modebar) on the right, shown only
    // while the pointer is over the chart (app.css), so the toolbar never covers the title
    const title = layout && layout.title ? Object.assign({x: 0.015, xanchor: 'left'}, layout.title)
      : undefined;
    requestAnimationFrame(() => PLOTLY.newPlot(box, traces, Object.assign({
      margin: {l: 50, r: 10, t: 30, b: 40}, height: 260, hovermode: 'closest',
      legend: {orientation: 'h', y: -0.25}, font: {size: 11},
      paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)',
    }, layout, title ? {title} : {}), {displaylogo: false, responsive: true,
      displayModeBar: 'hover', modeBarButtonsToRemove: ['toImage', 'select2d', 'lasso2d']}));
    return box;
  }

  // ---------------------------------------------------------------------------------------------
  // frame: header, problems banner, live updates
  let meta = null;
  function header() {
    const route = parseHash().name;
    const nav = [['overview', 'Overview'], ['trajectories', 'Trajectories'], ['compare', 'Compare'],
      ['live', 'Live']]
      .map(([name, text]) => link(href(name), text, {class: route === name ? 'active' : ''}));
    const live = REPORT ? h('span', Object.assign({class: 'live muted'}, testid('report-note')),
      'offline report · ' + (REPORT.meta.generated || ''))
      : h('span', Object.assign({class: 'live'}, testid('live')),
        meta ? meta.problems.trajectories + ' trajectories · live' : '');
    return h('header', {},
      h('span', {class: 'brand'}, 'otel-verl'), h('nav', {}, nav),
      h('span', {class: 'store muted', title: meta ? meta.store : ''}, meta ? meta.store : ''),
      live);
  }
  function problemsBanner() {
    if (!meta) return null;
    const p = meta.problems;
    const parts = [];
    if (p.bad_lines) parts.push(p.bad_lines + ' bad line(s) skipped');
    if (p.bad_spans) parts.push(p.bad_spans + ' undecodable span(s) skipped');
    if (p.files_with_incomplete_last_line) {
      parts.push(p.files_with_incomplete_last_line + ' file(s) end in an incomplete line ' +
        '(a writer crashed or is still writing; read once complete)');
    }
    if (p.partial_trajectories) {
      parts.push(p.partial_trajectories + ' trace(s) without a trajectory span, listed as ' +
        'partial (e.g. other services\' spans, or a crashed worker)');
    }
    if (p.bad_trajectories) {
      parts.push(p.bad_trajectories + ' trajectory(ies) could not be indexed (listed with ' +
        'status error)');
    }
    (p.notices || []).forEach((n) => parts.push(String(n)));
    if (!parts.length) return null;
    return h('div', Object.assign({class: 'banner'}, testid('problems')),
      h('strong', {}, 'Shown with gaps: '), parts.join('; ') + '.',
      p.examples && p.examples.length ? h('details', {}, h('summary', {}, 'first problems'),
        h('pre', {}, p.examples.join('\n'))) : null);
  }

  async function render() {
    const route = parseHash();
    currentRoute = location.hash;
    try {
      meta = await api('meta');
    } catch (error) {
      app.replaceChildren(h('p', {class: 'error'}, 'cannot reach the viewer: ' + error));
      return;
    }
    generation = meta.generation;
    // the new view is built aside and swapped in whole: no blank page while data loads
    const main = h('main', Object.assign({'data-route': decodeURIComponent(location.hash)},
      testid('view-' + route.name)));
    const view = VIEWS[route.name] || viewOverview;
    try {
      await view(main, route.params);
    } catch (error) {
      main.append(h('p', {class: 'error'}, 'failed to render: ' + error));
      console.error(error);
    }
    if (location.hash !== currentRoute) return;  // the user moved on meanwhile
    app.replaceChildren(header(), problemsBanner() || '', main);
  }

  async function poll() {
    if (REPORT) return;
    try {
      const fresh = await api('meta');
      const liveEl = document.querySelector('[data-testid="live"]');
      if (liveEl) liveEl.textContent = fresh.problems.trajectories + ' trajectories · live';
      const name = parseHash().name;
      if (fresh.generation !== generation && (name === 'overview' || name === 'trajectories')
          && location.hash === currentRoute && !document.querySelector('details[open]')
          && !(document.activeElement && /^(INPUT|SELECT|TEXTAREA)$/.test(
            document.activeElement.tagName))) {
        const y = window.scrollY;
        await render();
        window.scrollTo(0, y);
      }
      generation = fresh.generation;
    } catch (e) { /* the server went away: keep what is shown */ }
  }

  // ---------------------------------------------------------------------------------------------
  // overview
  // the detectors' flags per step (docs/signals.md): one bar per flag, when any step has one
  function flagChart(steps, xaxis, hovertemplate) {
    const names = [...new Set(steps.flatMap((s) => Object.keys(s.flags || {})))].sort();
    if (!names.length) return null;
    return chart('chart-flags', names.map((name) => ({x: steps.map((s) => s.step),
      y: steps.map((s) => (s.flags || {})[name] || 0), name, type: 'bar', hovertemplate})),
    {title: {text: 'Flagged trajectories per step'}, barmode: 'stack', xaxis});
  }

  async function viewOverview(main, params) {
    const experiments = meta.experiments;
    const experiment = params.experiment || (experiments.length === 1 ? experiments[0] : '');
    const data = await api('overview', {experiment});
    const picker = h('select', Object.assign({onchange: (e) =>
      (location.hash = href('overview', {experiment: e.target.value}))}, testid('experiment')),
    h('option', {value: ''}, 'all experiments'),
    experiments.map((x) => h('option', {value: x, selected: x === experiment}, x)));
    main.append(h('div', {class: 'toolbar'}, h('h1', {}, 'Run overview'), picker));
    if (!data.steps.length) {
      main.append(h('p', {class: 'muted'}, 'No trajectories in this store yet. They appear here ' +
        'while the run writes.'));
      return;
    }
    const flat = new Map(data.flat.map((f) => [f.experiment + '|' + f.validate + '|' + f.step, f]));
    const groups = new Map();
    for (const s of data.steps) {
      const key = (s.experiment || '(none)');
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(s);
    }
    const ordered = [...groups].sort(([a], [b]) => (a === '(none)') - (b === '(none)') ||
      (a < b ? -1 : a > b ? 1 : 0));
    for (const [name, steps] of ordered) {
      const stepped = steps.filter((s) => s.step !== null && s.step !== undefined &&
        s.trajectories > 0);
      const train = stepped.filter((s) => s.validate !== true);
      const val = stepped.filter((s) => s.validate === true);
      const series = (rows, field, label, extra) => Object.assign({
        x: rows.map((s) => s.step), y: rows.map((s) => s[field]), name: label,
        type: 'scatter', mode: 'lines+markers',
      }, extra || {});
      const hoverReward = (rows) => rows.map((s) =>
        `step ${s.step}<br>reward mean ${fmt(s.reward_mean)} ± ${fmt(s.reward_std)}` +
        `<br>pass rate ${pct(s.pass_rate)}<br>min ${fmt(s.reward_min)} max ${fmt(s.reward_max)}` +
        `<br>${s.trajectories} trajectories`);
      const rewardTraces = [
        series(train, 'reward_mean', 'training reward (mean)', {
          error_y: {type: 'data', array: train.map((s) => s.reward_std), visible: true},
          text: hoverReward(train), hovertemplate: '%{text}<extra></extra>'}),
      ];
      if (val.length) {
        rewardTraces.push(series(val, 'reward_mean', 'validation reward', {
          mode: 'markers', marker: {symbol: 'diamond', size: 11}, text: hoverReward(val),
          hovertemplate: '%{text}<extra></extra>'}));
      }
      const xaxis = stepAxis(stepped.map((s) => s.step));
      const hover = (unit) => `step %{x}<br>%{y:.3~f}${unit || ''}<extra>%{fullData.name}</extra>`;
      const section = h('section', {class: 'experiment'},
        h('h2', {}, 'experiment ', h('code', {}, name)));
      const grid = !stepped.length ? null : h('div', {class: 'charts'},
        chart('chart-reward', rewardTraces, {title: {text: 'Reward per step'}, xaxis}),
        chart('chart-pass', [
          series(train, 'pass_rate', 'training pass rate (reward > 0)', {hovertemplate: hover()}),
          ...(val.length ? [series(val, 'pass_rate', 'validation', {mode: 'markers',
            marker: {symbol: 'diamond', size: 11}, hovertemplate: hover()})] : []),
        ], {title: {text: 'Pass rate'}, xaxis, yaxis: {range: [0, 1.05], tickformat: '.0%'}}),
        chart('chart-tokens', [
          series(train, 'tokens_in_mean', 'prompt tokens / trajectory', {hovertemplate: hover()}),
          series(train, 'tokens_out_mean', 'response tokens / trajectory', {hovertemplate: hover()}),
        ], {title: {text: 'Tokens'}, xaxis}),
        chart('chart-tools', [
          {x: train.map((s) => s.step), y: train.map((s) => s.tool_calls), name: 'tool calls',
            type: 'bar', hovertemplate: hover()},
          {x: train.map((s) => s.step), y: train.map((s) => s.tool_errors), name: 'tool errors',
            type: 'bar', hovertemplate: hover()},
        ], {title: {text: 'Tool calls'}, barmode: 'group', xaxis}),
        chart('chart-latency', [
          series(train, 'duration_mean_ns', 'trajectory (mean)', {
            y: train.map((s) => s.duration_mean_ns / 1e9), hovertemplate: hover(' s')}),
          series(train, 'duration_max_ns', 'trajectory (max)', {
            y: train.map((s) => s.duration_max_ns / 1e9), hovertemplate: hover(' s')}),
          series(train, 'llm_mean_ns', 'in model calls (mean)', {
            y: train.map((s) => s.llm_mean_ns / 1e9), hovertemplate: hover(' s')}),
        ], {title: {text: 'Latency (s)'}, xaxis}),
        chart('chart-turns', [series(train, 'turns_mean', 'turns (mean)', {hovertemplate: hover()})],
          {title: {text: 'Turns per trajectory'}, xaxis}),
        flagChart(train, xaxis, hover()));
      if (stepped.length) {
        section.append(grid);
      } else {
        section.append(h('p', {class: 'muted'}, 'No training steps here: trajectories without ' +
          'rollout.step (spans of other services, or traces without a trajectory span). ',
        link(href('trajectories', {}), 'See them in the table.')));
      }
      const head = ['split', 'step', 'trajectories', 'prompts', 'reward mean', 'pass rate',
        'spread (std)', 'min', 'max', 'flat groups', 'turns', 'tokens in', 'tokens out',
        'tool calls', 'tool errors', 'with errors', 'latency mean', 'latency max',
        'ran (sampler)', 'kept because'];
      const body = steps.map((s) => {
        const f = flat.get(s.experiment + '|' + s.validate + '|' + s.step);
        const listHref = href('trajectories', {experiment: s.experiment, step: s.step,
          validate: s.validate === null ? '' : s.validate});
        return h('tr', {dataset: {step: s.step, split: split(s.validate)}},
          h('td', {}, split(s.validate)), h('td', {}, link(listHref, fmt(s.step))),
          h('td', {}, fmt(s.trajectories)), h('td', {}, fmt(s.prompts)),
          h('td', {class: 'reward-mean'}, fmt(s.reward_mean)), h('td', {}, pct(s.pass_rate)),
          h('td', {}, fmt(s.reward_std)), h('td', {}, fmt(s.reward_min)),
          h('td', {}, fmt(s.reward_max)),
          h('td', {title: 'GRPO groups whose rollouts all got the same reward (no advantage)'},
            f ? f.flat_groups + ' / ' + f.groups : '–'),
          h('td', {}, fmt(s.turns_mean, 1)), h('td', {}, fmt(s.tokens_in_mean, 0)),
          h('td', {}, fmt(s.tokens_out_mean, 0)), h('td', {}, fmt(s.tool_calls)),
          h('td', {class: s.tool_errors ? 'bad' : ''}, fmt(s.tool_errors)),
          h('td', {class: s.with_errors ? 'bad' : ''}, fmt(s.with_errors)),
          h('td', {}, dur(s.duration_mean_ns)), h('td', {}, dur(s.duration_max_ns)),
          h('td', {title: 'trajectories that ran, from the samplers\' reports (dropped ones ' +
            'included)'}, s.ran === null || s.ran === undefined ? '–' : `${s.ran} (` +
            `${s.dropped} dropped)`),
          h('td', {}, (s.sampling_reasons || []).join(', ') || '–'));
      });
      section.append(scroll(h('table', Object.assign({class: 'grid'}, testid('steps-table')),
        h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))), h('tbody', {}, body))));
      section.append(h('p', {class: 'muted'}, 'Means are weighted by rollout.sampling.weight ' +
        'when the sampler set it (1 otherwise), so they estimate every trajectory that ran, ' +
        'not only the kept ones. Pass rate: share of trajectories with reward > 0.'));
      main.append(section);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // trajectories table
  const COLUMNS = [
    ['trace_id', 'trace'], ['experiment', 'experiment'], ['step', 'step'],
    ['sample_index', 'sample'], ['rollout_n', 'rollout'], ['validate', 'split'],
    ['reward', 'reward'], ['turns', 'turns'], ['tokens_out', 'tokens out'],
    ['tool_calls', 'tools'], ['errors', 'errors'], ['duration_ns', 'duration'],
    ['status', 'status'], ['response', 'answer'],
  ];
  const selected = new Set();

  // the filtered table as a dataset file (docs/parity.md); only from the server, and only for
  // the filters the export knows (not the text search or errors-only)
  function exportLinks(p) {
    if (meta.mode !== 'server') return '';
    const keys = ['experiment', 'step', 'sample_index', 'rollout_n', 'validate', 'reward_min',
      'reward_max'];
    const q = new URLSearchParams(Object.fromEntries(keys.filter((k) => p[k]).map((k) => [k, p[k]])));
    const unsupported = p.text || p.errors === 'true';
    return h('span', Object.assign({class: 'export'}, testid('export')), 'export: ',
      ...['jsonl', 'parquet'].map((fmt) => unsupported
        ? h('span', {class: 'muted', title: 'export ignores text and errors filters'}, fmt + ' ')
        : h('a', Object.assign({href: 'export.' + fmt + '?' + q, download: 'trajectories.' + fmt},
          testid('export-' + fmt)), fmt + ' ')));
  }

  async function viewTrajectories(main, params) {
    const p = Object.assign({page: 0, page_size: 50}, params);
    const data = await api('trajectories', p);
    const go = (changes) => (location.hash = href('trajectories', Object.assign({}, p, changes)));
    const field = (name, label, attrs) => h('label', {}, label,
      h('input', Object.assign({name, value: p[name] || '', size: 6}, testid('filter-' + name),
        attrs || {})));
    const form = h('form', Object.assign({class: 'filters', onsubmit: (e) => {
      e.preventDefault();
      const values = Object.fromEntries(new FormData(e.target).entries());
      values.errors = e.target.errors.checked ? 'true' : '';
      location.hash = href('trajectories', Object.assign(values, {order: p.order, desc: p.desc,
        page: 0}));
    }}, testid('filters')),
    h('label', {}, 'experiment', h('select', Object.assign({name: 'experiment'},
      testid('filter-experiment')), h('option', {value: ''}, 'any'),
    meta.experiments.map((x) => h('option', {value: x, selected: x === p.experiment}, x)))),
    field('step', 'step'), field('sample_index', 'sample'), field('rollout_n', 'rollout n'),
    h('label', {}, 'split', h('select', Object.assign({name: 'validate'}, testid('filter-validate')),
      h('option', {value: ''}, 'any'),
      h('option', {value: 'false', selected: p.validate === 'false'}, 'training'),
      h('option', {value: 'true', selected: p.validate === 'true'}, 'validation'))),
    field('reward_min', 'reward ≥'), field('reward_max', 'reward ≤'),
    h('label', {}, h('input', Object.assign({type: 'checkbox', name: 'errors',
      checked: p.errors === 'true'}, testid('filter-errors'))), 'errors only'),
    field('text', 'text', {size: 18, placeholder: 'prompt, answer, tool call…'}),
    field('flag', 'flag', {size: 14, placeholder: 'e.g. length_cap'}),
    h('button', Object.assign({type: 'submit'}, testid('apply')), 'Apply'),
    link(href('trajectories'), 'clear'));
    main.append(h('h1', {}, 'Trajectories'), form);

    const compareBtn = h('button', Object.assign({disabled: selected.size !== 2, onclick: () => {
      const [a, b] = [...selected];
      location.hash = href('compare', {a, b});
    }}, testid('compare-selected')), 'Compare the 2 selected');
    const first = data.total ? data.page * data.page_size + 1 : 0;
    const last = Math.min(data.total, (data.page + 1) * data.page_size);
    main.append(h('div', {class: 'toolbar'},
      h('span', testid('count'), `${first}–${last} of ${data.total}`),
      h('button', {disabled: data.page <= 0, onclick: () => go({page: data.page - 1})}, '‹ prev'),
      h('button', Object.assign({disabled: last >= data.total,
        onclick: () => go({page: data.page + 1})}, testid('next')), 'next ›'),
      compareBtn, exportLinks(p)));
    const headCells = [h('th', {}, '')].concat(COLUMNS.map(([key, label]) => {
      const active = (p.order || 'start_ns') === key;
      const arrow = active ? (p.desc === 'true' ? ' ▼' : ' ▲') : '';
      if (key === 'response') return h('th', {}, label);
      return h('th', {class: 'sortable', 'data-sort': key, onclick: () =>
        go({order: key, desc: active && p.desc !== 'true' ? 'true' : '', page: 0})}, label + arrow);
    }));
    const rows = data.rows.map((r) => {
      const box = h('input', {type: 'checkbox', checked: selected.has(r.key), onchange: (e) => {
        if (e.target.checked) selected.add(r.key); else selected.delete(r.key);
        while (selected.size > 2) selected.delete([...selected][0]);
        compareBtn.disabled = selected.size !== 2;
      }});
      const groupHref = href('group', {experiment: r.experiment, step: r.step,
        sample_index: r.sample_index, validate: r.validate});
      return h('tr', {dataset: {key: r.key}, class: r.status === 'error' ? 'row-error' : ''},
        h('td', {}, box),
        h('td', {}, link(href('trajectory', {key: r.key}), short(r.trace_id), {class: 'mono'})),
        h('td', {}, fmt(r.experiment)), h('td', {}, fmt(r.step)),
        h('td', {}, r.sample_index === null ? '–' : link(groupHref, fmt(r.sample_index),
          {title: 'the GRPO group'})),
        h('td', {}, fmt(r.rollout_n)), h('td', {}, split(r.validate)),
        h('td', {class: 'num reward'}, fmt(r.reward)), h('td', {}, fmt(r.turns)),
        h('td', {}, fmt(r.tokens_out)),
        h('td', {}, fmt(r.tool_calls) + (r.tool_errors ? ` (${r.tool_errors} failed)` : '')),
        h('td', {class: r.errors ? 'bad' : ''}, fmt(r.errors)), h('td', {}, dur(r.duration_ns)),
        h('td', {class: 'status-' + (r.span_id ? r.status : 'partial'), title: r.span_id ? '' :
          'no trajectory span: the spans of this trace without one (another service, or a ' +
          'worker that crashed before the trajectory ended)'},
        r.span_id ? r.status : 'partial' + (r.status === 'error' ? ' · error' : '')),
        h('td', {class: 'snippet', title: r.response || ''}, r.response || r.error || ''));
    });
    main.append(scroll(h('table', Object.assign({class: 'grid'}, testid('trajectory-table')),
      h('thead', {}, h('tr', {}, headCells)), h('tbody', {}, rows))));
    if (!data.total) main.append(h('p', {class: 'muted'}, 'No trajectory matches these filters.'));
  }

  // ---------------------------------------------------------------------------------------------
  // one trajectory
  function summary(row) {
    const items = [
      ['experiment', row.experiment], ['step', row.step], ['sample', row.sample_index],
      ['rollout', row.rollout_n], ['split', split(row.validate)], ['turns', row.turns],
      ['tokens in / out', fmt(row.tokens_in) + ' / ' + fmt(row.tokens_out)],
      ['tool calls', row.tool_calls + (row.tool_errors ? ` (${row.tool_errors} failed)` : '')],
      ['spans', row.spans], ['duration', dur(row.duration_ns)], ['status', row.status],
      ['ended', row.termination], ['kept because', row.sampling_reason],
      ['weight', row.weight], ['trace', row.trace_id],
    ];
    return h('dl', Object.assign({class: 'summary'}, testid('summary')),
      items.map(([k, v]) => [h('dt', {}, k), h('dd', {}, fmt(v))]));
  }
  function rewardBadge(reward, row) {
    const score = reward ? reward.score : row.reward;
    const cls = score === null || score === undefined ? 'none' : score > 0 ? 'good' : 'zero';
    return h('span', Object.assign({class: 'reward-badge ' + cls}, testid('reward')),
      'reward ' + fmt(score), reward && reward.label ? h('span', Object.assign({class: 'label'},
        testid('reward-label')), reward.label) : null,
      reward && reward.name ? h('span', {class: 'muted'}, ' (' + reward.name + ')') : null);
  }
  function message(m, index) {
    const card = h('div', Object.assign({class: 'msg role-' + m.role, dataset: {index}},
      testid('message')));
    const head = h('div', {class: 'msg-head'}, h('span', {class: 'role'}, m.role));
    if (m.turn) {
      head.append(h('span', Object.assign({class: 'turn-stats'}, testid('turn-stats')),
        `turn ${m.turn.index} · ${fmt(m.turn.tokens_in)} tokens in · ` +
        `${fmt(m.turn.tokens_out)} out · ${dur(m.turn.duration_ns)}` +
        (m.turn.model ? ' · ' + m.turn.model : '') +
        (m.turn.finish ? ' · ' + [].concat(m.turn.finish).join(',') : '')));
    }
    if (m.tool) {
      head.append(h('span', {class: 'turn-stats'}, `${m.tool.name} · ${dur(m.tool.duration_ns)}`),
        h('span', {class: m.tool.ok ? 'ok' : 'bad'}, m.tool.ok ? 'ok' : 'failed'));
    }
    card.append(head);
    if (m.content && !(m.tool && String(m.tool.result) === m.content)) {
      card.append(h('pre', {class: 'content'}, m.content));
    }
    for (const call of m.tool_calls || []) {
      card.append(h('div', Object.assign({class: 'tool-call'}, testid('tool-call')),
        h('span', {class: 'muted'}, 'calls '), h('code', {}, call.name || '?'),
        h('pre', Object.assign({}, testid('tool-args')), pretty(call.arguments))));
    }
    if (m.tool) {
      card.append(h('div', Object.assign({class: 'tool-result'}, testid('tool-result')),
        h('span', {class: 'muted'}, 'arguments '), h('code', {}, pretty(m.tool.arguments)),
        h('span', {class: 'muted'}, ' → result '), h('code', {}, pretty(m.tool.result))));
    }
    return card;
  }
  function waterfall(rows, total) {
    const box = h('div', Object.assign({class: 'waterfall'}, testid('waterfall')));
    const span = Math.max(total || 1, ...rows.map((r) => (r.offset_ns || 0) + (r.duration_ns || 0)));
    for (const r of rows) {
      const left = 100 * (r.offset_ns || 0) / span;
      const width = Math.max(0.3, 100 * (r.duration_ns || 0) / span);
      const engine = r.service && !/otel-verl/.test(r.service) && r.depth > 0;
      const details = h('details', {class: 'span-row ' + (r.status === 'ERROR' ? 'span-error' : ''),
        dataset: {name: r.name}},
      h('summary', {},
        h('span', {class: 'span-name', style: `padding-left:${r.depth * 14}px`}, r.name,
          engine ? h('span', {class: 'engine-tag'}, r.service) : null),
        h('span', {class: 'bar-track'}, h('span', {class: 'bar' + (engine ? ' engine' : '') +
          (r.status === 'ERROR' ? ' error' : ''), style: `left:${left}%;width:${width}%`})),
        h('span', {class: 'span-dur'}, dur(r.duration_ns))));
      const body = h('div', {class: 'span-body'});
      if (r.status_message) body.append(h('p', {class: 'bad'}, r.status_message));
      if (r.input !== null && r.input !== undefined) {
        body.append(h('div', {class: 'muted'}, 'input'), h('pre', {}, pretty(r.input)));
      }
      if (r.output !== null && r.output !== undefined) {
        body.append(h('div', {class: 'muted'}, 'output'), h('pre', {}, pretty(r.output)));
      }
      const attrs = Object.entries(r.attributes);
      if (attrs.length) {
        body.append(h('table', {class: 'attrs'}, attrs.map(([k, v]) =>
          h('tr', {}, h('td', {class: 'mono'}, k), h('td', {}, h('pre', {}, pretty(v)))))));
      }
      for (const e of r.events) {
        body.append(h('div', {class: 'muted'}, 'event ' + e.name),
          h('pre', {}, JSON.stringify(e.attributes, null, 2)));
      }
      details.append(body);
      box.append(details);
    }
    return box;
  }

  async function viewTrajectory(main, params) {
    const data = await api('trajectory', {key: params.key});
    if (!data) {
      main.append(h('p', {class: 'error'}, 'No trajectory ' + (params.key || '') + ' here.'));
      return;
    }
    const row = data.row;
    const groupHref = href('group', {experiment: row.experiment, step: row.step,
      sample_index: row.sample_index, validate: row.validate});
    const promptHref = href('prompt', {experiment: row.experiment, sample_index: row.sample_index,
      validate: row.validate});
    main.append(h('div', {class: 'toolbar'},
      h('h1', {}, 'Trajectory ', h('code', {}, short(row.trace_id))), rewardBadge(data.reward, row),
      row.sample_index !== null ? link(groupHref, 'its GRPO group', testid('to-group')) : null,
      row.sample_index !== null ? link(promptHref, 'this prompt through training',
        testid('to-prompt')) : null,
      link(href('compare', {a: row.key}), 'compare with…')));
    main.append(summary(row));
    if (data.problems && data.problems.length) {  // sections the spans could not build
      main.append(h('p', Object.assign({class: 'banner'}, testid('trajectory-problems')),
        h('strong', {}, 'Shown with gaps: '), data.problems.join('; ')));
    }
    if (data.missing) {
      main.append(h('p', {class: 'banner'}, data.missing));
      return;
    }
    if (data.flags && data.flags.length) {  // the detectors' flags (docs/signals.md)
      main.append(h('section', Object.assign({class: 'flags'}, testid('flags')),
        h('h2', {}, 'Flags'), data.flags.map((f) => h('div', Object.assign({class: 'flag-item'},
          testid('flag-' + f.name)), h('strong', {}, f.name + ': '),
          h('code', {}, typeof f.evidence === 'string' ? f.evidence
            : JSON.stringify(f.evidence))))));
    }
    if (data.errors.length) {
      main.append(h('section', Object.assign({class: 'errors'}, testid('errors')),
        h('h2', {}, 'Errors'), data.errors.map((e) => h('div', {class: 'error-item'},
          h('strong', {}, e.type + ': '), h('span', testid('error-message'), e.message),
          h('span', {class: 'muted'}, ' raised in ' + e.span + (e.through && e.through.length ?
            ', through ' + e.through.slice().reverse().join(' → ') : '')),
          e.stacktrace ? h('details', {}, h('summary', {}, 'stack trace'),
            h('pre', {}, e.stacktrace)) : null))));
    }
    const convo = h('section', Object.assign({class: 'conversation'}, testid('conversation')),
      h('h2', {}, 'Conversation'));
    if (!data.messages.length) convo.append(h('p', {class: 'muted'}, 'No messages recorded.'));
    data.messages.forEach((m, i) => convo.append(message(m, i)));
    const shown = new Set(data.messages.filter((m) => m.tool).map((m) => m.tool.span_id));
    const unmatched = data.tools.filter((t) => !shown.has(t.span_id));
    if (unmatched.length) {
      convo.append(h('h3', {}, 'Tool calls'));
      for (const t of unmatched) convo.append(message({role: 'tool', content: '', tool: t}, -1));
    }
    main.append(convo);
    main.append(h('section', {}, h('h2', {}, 'Timeline (span waterfall; engine spans tinted)'),
      waterfall(data.waterfall, row.duration_ns)));
  }

  // ---------------------------------------------------------------------------------------------
  // GRPO group
  function assistantTexts(detail) {
    return detail ? detail.messages.filter((m) => m.role !== 'user' && m.role !== 'system')
      .map((m) => m.role + ': ' + (m.content || '') +
        (m.tool_calls || []).map((c) => ` [${c.name}(${typeof c.arguments === 'string' ?
          c.arguments : JSON.stringify(c.arguments)})]`).join('')) : [];
  }
  async function viewGroup(main, params) {
    const data = await api('group', params);
    const rows = data.rows;
    main.append(h('h1', {}, `GRPO group: step ${fmt(numParam(params.step))}, sample ` +
      `${fmt(numParam(params.sample_index))}`), h('p', {class: 'muted'},
      `experiment ${params.experiment || '–'} · ${split(boolParam(params.validate))} · ` +
      `${rows.length} rollout(s)`));
    if (!rows.length) return;
    const rewards = rows.filter((r) => r.reward !== null).map((r) => r.reward);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    const std = rewards.length ? Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) /
      rewards.length) : null;
    main.append(h('p', testid('group-stats'), `reward mean ${fmt(mean)}, std ${fmt(std)}` +
      (std === 0 && rewards.length > 1 ? ' — every rollout got the same reward: zero advantage,' +
        ' no learning signal from this group' : '')));
    main.append(chart('chart-group', [{
      x: rows.map((r) => 'rollout ' + r.rollout_n), y: rows.map((r) => r.reward), type: 'bar',
      text: rows.map((r) => r.reward === null || mean === null ? '' :
        'advantage ' + fmt(r.reward - mean)), hovertemplate: '%{x}<br>reward %{y}<br>%{text}' +
        '<extra></extra>', textposition: 'outside', cliponaxis: false}],
    {title: {text: 'Reward per rollout'}, height: 240, yaxis: {rangemode: 'tozero'}}));
    const texts = rows.map((r) => assistantTexts(data.details[r.key]));
    const longest = Math.max(0, ...texts.map((t) => t.length));
    let diverge = -1;
    for (let i = 0; i < longest && diverge < 0; i++) {
      if (new Set(texts.map((t) => t[i])).size > 1) diverge = i;
    }
    main.append(h('table', Object.assign({class: 'grid'}, testid('group-table')),
      h('thead', {}, h('tr', {}, ['rollout', 'reward', 'advantage', 'turns', 'tokens out',
        'tools', 'errors', 'answer'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.map((r) => h('tr', {dataset: {rollout: r.rollout_n}},
        h('td', {}, link(href('trajectory', {key: r.key}), fmt(r.rollout_n))),
        h('td', {class: 'reward'}, fmt(r.reward)),
        h('td', {class: 'advantage'}, r.reward === null || mean === null ? '–' :
          (r.reward - mean >= 0 ? '+' : '') + fmt(r.reward - mean)),
        h('td', {}, fmt(r.turns)), h('td', {}, fmt(r.tokens_out)), h('td', {}, fmt(r.tool_calls)),
        h('td', {class: r.errors ? 'bad' : ''}, fmt(r.errors)),
        h('td', {class: 'snippet'}, r.response || r.error || ''))))));
    main.append(h('h2', {}, 'Side by side'), h('p', Object.assign({class: 'muted'},
      testid('divergence')), diverge < 0 ? 'All rollouts took the same steps.' :
      `The responses diverge at step ${diverge + 1} (highlighted); cells that differ from ` +
      'rollout ' + fmt(rows[0].rollout_n) + ' are marked.'));
    const grid = h('div', {class: 'side-by-side', style:
      `grid-template-columns: repeat(${rows.length}, minmax(220px, 1fr))`});
    rows.forEach((r, col) => {
      const column = h('div', {class: 'column'}, h('h3', {}, link(href('trajectory', {key: r.key}),
        'rollout ' + fmt(r.rollout_n)), ' ', rewardBadge(null, r)));
      texts[col].forEach((t, i) => column.append(h('pre', {class: 'cell' +
        (i === diverge ? ' diverge' : '') + (col > 0 && texts[0][i] !== t ? ' differs' : '')}, t)));
      if (!data.details[r.key]) column.append(h('p', {class: 'muted'}, 'details not loaded'));
      grid.append(column);
    });
    main.append(grid);
  }

  // ---------------------------------------------------------------------------------------------
  // a prompt through training
  async function viewPrompt(main, params) {
    const data = await api('prompt', params);
    const rows = data.rows;
    main.append(h('h1', {}, `Prompt ${fmt(numParam(params.sample_index))} through training`));
    if (!rows.length) {
      main.append(h('p', {class: 'muted'}, 'No trajectories for this prompt.'));
      return;
    }
    const prompt = rows.find((r) => r.prompt);
    if (prompt) main.append(h('pre', Object.assign({class: 'prompt'}, testid('prompt-text')),
      prompt.prompt));
    const steps = [...new Set(rows.map((r) => r.step))];
    const byStep = steps.map((s) => rows.filter((r) => r.step === s));
    const means = byStep.map((rs) => {
      const v = rs.filter((r) => r.reward !== null).map((r) => r.reward);
      return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
    });
    main.append(chart('chart-prompt', [
      {x: steps, y: means, name: 'mean reward', type: 'scatter', mode: 'lines+markers',
        hovertemplate: 'step %{x}<br>mean reward %{y:.3f}<extra></extra>'},
      {x: rows.map((r) => r.step), y: rows.map((r) => r.reward), name: 'rollouts',
        type: 'scatter', mode: 'markers', marker: {opacity: 0.5},
        text: rows.map((r) => 'rollout ' + r.rollout_n),
        hovertemplate: 'step %{x}, %{text}<br>reward %{y}<extra></extra>'},
    ], {title: {text: 'Reward by step'}, xaxis: stepAxis(steps)}));
    const table = h('table', Object.assign({class: 'grid'}, testid('prompt-table')),
      h('thead', {}, h('tr', {}, ['step', 'split', 'rollout', 'reward', 'turns', 'answer']
        .map((c) => h('th', {}, c)))));
    const body = h('tbody');
    rows.forEach((r) => body.append(h('tr', {dataset: {step: r.step}},
      h('td', {}, link(href('group', {experiment: r.experiment, step: r.step,
        sample_index: r.sample_index, validate: r.validate}), fmt(r.step))),
      h('td', {}, split(r.validate)),
      h('td', {}, link(href('trajectory', {key: r.key}), fmt(r.rollout_n))),
      h('td', {class: 'reward'}, fmt(r.reward)), h('td', {}, fmt(r.turns)),
      h('td', {class: 'snippet'}, r.response || r.error || ''))));
    table.append(body);
    main.append(table);
  }

  // ---------------------------------------------------------------------------------------------
  // compare
  async function viewCompare(main, params) {
    main.append(h('h1', {}, 'Compare two trajectories'));
    const form = h('form', {class: 'filters', onsubmit: (e) => {
      e.preventDefault();
      location.hash = href('compare', {a: e.target.a.value.trim(), b: e.target.b.value.trim()});
    }}, h('label', {}, 'A', h('input', {name: 'a', value: params.a || '', size: 40})),
    h('label', {}, 'B', h('input', {name: 'b', value: params.b || '', size: 40})),
    h('button', {type: 'submit'}, 'Compare'),
    h('span', {class: 'muted'}, 'keys from the trajectories table (select two rows there)'));
    main.append(form);
    if (!params.a || !params.b) return;
    const [a, b] = await Promise.all([api('trajectory', {key: params.a}),
      api('trajectory', {key: params.b})]);
    if (!a || !b) {
      main.append(h('p', {class: 'error'}, 'unknown trajectory key'));
      return;
    }
    const fields = [['experiment'], ['step'], ['sample_index'], ['rollout_n'], ['validate'],
      ['reward'], ['turns'], ['tokens_in'], ['tokens_out'], ['tool_calls'], ['tool_errors'],
      ['spans'], ['duration_ns', dur], ['status'], ['errors']];
    main.append(h('table', Object.assign({class: 'grid compare'}, testid('compare-summary')),
      h('thead', {}, h('tr', {}, h('th', {}, ''),
        h('th', {}, link(href('trajectory', {key: a.row.key}), 'A ' + short(a.row.trace_id))),
        h('th', {}, link(href('trajectory', {key: b.row.key}), 'B ' + short(b.row.trace_id))),
        h('th', {}, ''))),
      h('tbody', {}, fields.map(([k, f]) => {
        const x = a.row[k], y = b.row[k];
        return h('tr', {dataset: {field: k}}, h('td', {}, k), h('td', {}, (f || fmt)(x)),
          h('td', {}, (f || fmt)(y)), h('td', {class: 'bad'}, x === y ? '' : '≠'));
      }))));
    const ma = a.messages || [], mb = b.messages || [];
    const n = Math.max(ma.length, mb.length);
    let differ = 0;
    const grid = h('div', Object.assign({class: 'side-by-side',
      style: 'grid-template-columns: 1fr 1fr'}, testid('compare-messages')));
    for (let i = 0; i < n; i++) {
      const x = ma[i], y = mb[i];
      const same = x && y && x.role === y.role && x.content === y.content &&
        JSON.stringify(x.tool_calls) === JSON.stringify(y.tool_calls);
      if (!same) differ++;
      for (const m of [x, y]) {
        const cell = m ? message(m, i) : h('div', {class: 'msg muted'}, '—');
        if (!same) cell.classList.add('differs');
        grid.append(cell);
      }
    }
    main.append(h('h2', {}, 'Conversation, message by message'),
      h('p', testid('compare-count'), `${differ} of ${n} messages differ`), grid);
  }

  // ---------------------------------------------------------------------------------------------
  // live board (docs/live.md): what runs now, from the workers' live files; stuck first, lost
  // workers shown with what they had in flight; refreshed every second while shown
  async function viewLive(main) {
    main.append(h('h2', {}, 'Live'));
    if (REPORT) {
      main.append(h('p', {class: 'muted'}, 'the live board needs the viewer (otel-verl ui)'));
      return;
    }
    const board = await api('live');
    // the server's counts (views.live_view), from the rows below: a trajectory in flight is a
    // row too (its own span, in italics), so the STUCK rows are its stuck trajectories plus
    // its stuck ops, each counted apart
    const n = board.counts;
    const lost = board.workers.filter((w) => w.lost).length;
    const many = (k, one, more) => `${k} ${k === 1 ? one : more}`;
    main.append(h('p', testid('live-summary'),
      `${board.workers.length} worker(s)${lost ? ` (${lost} lost)` : ''} · in flight: ` +
      `${many(n.trajectories, 'trajectory', 'trajectories')} (${n.trajectories_stuck} stuck), ` +
      `${many(n.ops, 'op', 'ops')} (${n.ops_stuck} stuck)`));
    const cell = (v) => h('td', {}, v === null || v === undefined ? '—' : String(v));
    main.append(h('h3', {}, 'Trajectories in flight per step'), scroll(h('table', Object.assign({class: 'grid'}, testid('live-steps')),
      h('tr', {}, ['step', 'experiment', 'traced', 'unsampled', 'stuck'].map((t) => h('th', {}, t))),
      board.steps.map((s) => h('tr', {}, cell(s.step), cell(s.experiment), cell(s.traced),
        cell(s.unsampled), cell(s.stuck))))));
    main.append(h('h3', {}, 'Ops in flight (stuck first)'), scroll(h('table', Object.assign({class: 'grid'}, testid('live-ops')),
      h('tr', {}, ['', 'worker', 'step', 'sample', 'n', 'op', 'kind', 'elapsed', 'waits on',
        'request'].map((t) => h('th', {}, t))),
      board.ops.map((o) => h('tr', Object.assign({class: o.stuck ? 'stuck' : ''},
        testid(o.stuck ? 'live-stuck' : 'live-op')),
        h('td', {}, o.stuck ? h('strong', {class: 'error'}, 'STUCK') : '',
          o.lost ? h('strong', {class: 'error'}, ' LOST') : ''),
        cell(o.worker), cell(o.step), cell(o.sample_index), cell(o.rollout_n),
        h('td', {}, o.trajectory ? h('em', {}, o.name) : o.name), cell(o.kind),
        cell(o.elapsed_s.toFixed(1) + ' s'), cell(o.waiting_on ? o.waiting_on.name : null),
        cell(o.request_id))))));
    main.append(h('h3', {}, 'Workers'), scroll(h('table', Object.assign({class: 'grid'}, testid('live-workers')),
      h('tr', {}, ['worker', 'state', 'heartbeat', 'trajectories', 'stuck trajectories',
        'stuck ops'].map((t) => h('th', {}, t))),
      board.workers.map((w) => h('tr', {}, cell(w.worker),
        h('td', {}, w.lost ? h('strong', {class: 'error'}, 'lost') : 'live'),
        cell(w.heartbeat_age_s.toFixed(1) + ' s ago'), cell(w.trajectories),
        cell(w.stuck_trajectories), cell(w.stuck_ops))))));
    if (board.straggler_reports.length) {
      main.append(h('h3', {}, 'Straggler reports'), scroll(h('table', Object.assign({class: 'grid'}, testid('live-stragglers')),
        h('tr', {}, ['step', 'trajectories', 'median', 'tail wait', 'slowest', 'dominant op']
          .map((t) => h('th', {}, t))),
        board.straggler_reports.map((r) => {
          const first = r.slowest[0] || {};
          return h('tr', {}, cell(r.step), cell(r.trajectories), cell(r.median_s.toFixed(2) + ' s'),
            cell(r.tail_wait_s.toFixed(2) + ' s'),
            cell(`sample ${first.sample_index} (${(first.duration_s || 0).toFixed(2)} s)`),
            cell(first.dominant_op));
        }))));
    }
    const shown = location.hash;
    setTimeout(() => {
      if (location.hash === shown && parseHash().name === 'live') render();
    }, 1000);
  }

  const VIEWS = {overview: viewOverview, trajectories: viewTrajectories,
    trajectory: viewTrajectory, group: viewGroup, prompt: viewPrompt, compare: viewCompare,
    live: viewLive};

  window.addEventListener('hashchange', render);
  render();
  if (!REPORT) setInterval(poll, 2000);
})();
