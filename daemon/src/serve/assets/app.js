// gitplane's status page: environments, deployments, held deployments, failures and the
// resource graph, from /api/*. Plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Live: /api/events is read with fetch (a streamed body, so the token cookie goes along like on
// every other request), and each event refetches, at most once a second. A poll every 10 s
// catches what the daemon does not announce (a `gitplane apply` run from another process).
//
// Everything that comes from the API is put in the page as text (textContent, attributes),
// never as HTML.

'use strict';

(function () {
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const POLL_MS = 10000;
  const REFRESH_GAP_MS = 1000;
  const RECONNECT_MS = 3000;
  const SEARCH_DELAY_MS = 300;
  const GLOBAL_APP = '(global)';
  const EDGE_KINDS = [
    ['dependency', 'dependency'],
    ['reference', 'reference'],
    ['coprovision', 'co-provisioned'],
    ['selector', 'selector'],
    ['implicit', 'implicit'],
  ];
  const STATUSES = [
    ['ready', 'ready'],
    ['failed', 'failed'],
    ['blocked', 'blocked (not made)'],
    ['orphaned', 'orphaned'],
    ['in_progress', 'in progress'],
  ];
  // Worst first: an app is as bad as its worst resource.
  const WORST_FIRST = ['failed', 'blocked', 'orphaned', 'in_progress', 'ready'];
  // The list view draws at most this many rows; the filters narrow the rest.
  const LIST_ROWS = 2000;
  // Errors longer than this show their first line, cut, with "more".
  const SHORT_ERROR = 140;

  const state = {
    env: null,
    overview: null,
    graph: null,
    // The environment counted for the app list and filters (`total`, `apps`, `types`), for the
    // type and search of `key`, as of refresh `tick`: one app's graph does not carry it.
    census: null,
    refreshTick: 0,
    filters: { app: '', type: '', q: '' },
    // `graph` or `list`, and the list's order.
    mode: 'graph',
    sort: { key: 'status', desc: false },
    selected: null,
    // Pan and zoom of the graph; `moved` once the user has moved it since the last fit.
    view: { x: 0, y: 0, k: 1, moved: false },
    graphKey: '',
    statuses: new Map(),
    seen: new Set(),
    refreshes: 0,
  };

  const $ = (id) => document.getElementById(id);

  // An element with attributes (`text` sets its text) and children.
  function el(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }

  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function build(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') node.textContent = String(v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  async function api(path) {
    const response = await fetch(path, {
      credentials: 'same-origin',
      headers: { Accept: 'application/json' },
      cache: 'no-store',
    });
    if (response.status === 401) {
      location.href = '/login';
      throw new Error('a token is required: sign in');
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${path}: ${response.status}`);
    return body;
  }

  function problem(message) {
    const p = $('problem');
    p.hidden = !message;
    p.textContent = message || '';
  }

  const short = (commit) => (commit ? commit.slice(0, 7) : '—');
  const label = (r) => `${r.type}${r.class && r.class !== 'default' ? '.' + r.class : ''}#${r.res_id}`;

  function elide(text, max) {
    return text.length <= max ? text : '…' + text.slice(text.length - max + 1);
  }

  // `text` cut at its end: for sentences, whose start says the most.
  function clip(text, max) {
    return text.length <= max ? text : text.slice(0, max - 1) + '…';
  }

  function when(iso) {
    if (!iso) return '';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return iso;
    const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
    return d.toDateString() === new Date().toDateString()
      ? time
      : `${d.toLocaleDateString([], { month: 'short', day: 'numeric' })} ${time}`;
  }

  const statusWord = (s) => (s || '').replace('_', ' ');
  const rank = (s) => {
    const i = WORST_FIRST.indexOf(s);
    return i < 0 ? 0 : i;
  };

  // A long text as one line with a "more" button that shows it whole (and "less" again).
  function longText(text, cls) {
    const full = String(text || '');
    const firstLine = full.split('\n')[0];
    if (full.length <= SHORT_ERROR && firstLine === full) return el('span', { class: cls, text: full });
    const cut = firstLine.length > SHORT_ERROR ? firstLine.slice(0, SHORT_ERROR) + '…' : firstLine + ' …';
    const shown = el('span', { class: 'text', text: cut });
    const more = el('button', { type: 'button', class: 'more', text: 'more' });
    const box = el('span', { class: `${cls} long`, 'data-long': '', title: full.length > 2000 ? null : full }, shown, ' ', more);
    more.addEventListener('click', (ev) => {
      ev.stopPropagation();
      const open = box.classList.toggle('open');
      shown.textContent = open ? full : cut;
      more.textContent = open ? 'less' : 'more';
    });
    return box;
  }

  function took(started, finished) {
    if (!finished) return 'running';
    const s = (new Date(finished) - new Date(started)) / 1000;
    if (!(s >= 0)) return '';
    if (s < 10) return `${s.toFixed(2)} s`;
    if (s < 60) return `${s.toFixed(1)} s`;
    return `${Math.floor(s / 60)} m ${Math.round(s % 60)} s`;
  }

  // ---------------------------------------------------------------------------------------
  // Where the page is: the environment and filters live in the address's fragment, so a
  // link or a reload shows the same view.

  function readLocation() {
    const p = new URLSearchParams(location.hash.slice(1));
    state.env = p.get('env') || null;
    state.filters.app = p.get('app') || '';
    state.filters.type = p.get('type') || '';
    state.filters.q = p.get('q') || '';
    state.mode = p.get('view') === 'list' ? 'list' : 'graph';
    const sort = p.get('sort') || 'status';
    state.sort = { key: sort.replace(/^-/, ''), desc: sort.startsWith('-') };
    state.wantSelected = p.get('res') || null;
  }

  // Each view (environment, filters, graph or list, order, open resource) is an entry of the
  // browser's history, so back and forward move between views; `push` false replaces the
  // current entry (a correction, not a step).
  function writeLocation(push) {
    const p = new URLSearchParams();
    if (state.env) p.set('env', state.env);
    for (const k of ['app', 'type', 'q']) if (state.filters[k]) p.set(k, state.filters[k]);
    if (state.mode === 'list') {
      p.set('view', 'list');
      if (state.sort.key !== 'status' || state.sort.desc) p.set('sort', (state.sort.desc ? '-' : '') + state.sort.key);
    }
    if (state.selected) p.set('res', state.selected);
    const hash = '#' + p.toString();
    if (hash === location.hash) return;
    if (push) history.pushState(null, '', hash);
    else history.replaceState(null, '', hash);
  }

  // Back or forward: show the view the address names.
  function followLocation() {
    const env = state.env;
    readLocation();
    if (state.env !== env) {
      state.graphKey = '';
    }
    $('filter-q').value = state.filters.q;
    renderEnvs();
    renderOverview();
    renderMode();
    loadGraph().catch((e) => problem(e.message));
    if (state.wantSelected) {
      if (state.wantSelected !== state.selected) select(state.wantSelected, false);
    } else if (state.selected) closeDetails(false);
  }

  // ---------------------------------------------------------------------------------------
  // Refreshing: one at a time, at most one a second; asks that arrive meanwhile merge.

  let refreshing = false;
  let again = false;
  let lastRefresh = 0;
  let refreshTimer = null;

  function scheduleRefresh() {
    if (refreshTimer) return;
    const wait = Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now());
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      refresh();
    }, wait);
  }

  async function refresh() {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = true;
    lastRefresh = Date.now();
    state.refreshTick += 1;
    try {
      await loadOverview();
      await loadGraph();
      if (state.wantSelected) {
        const want = state.wantSelected;
        state.wantSelected = null;
        if (want !== state.selected) select(want, false);
      }
      problem(null);
    } catch (e) {
      problem(e.message);
    } finally {
      refreshing = false;
      state.refreshes += 1;
      document.body.dataset.refreshes = String(state.refreshes);
    }
    if (again) {
      again = false;
      scheduleRefresh();
    }
  }

  // ---------------------------------------------------------------------------------------
  // The overview: environments, resources by status, held deployments, failures, deployments.

  async function loadOverview() {
    const overview = await api('/api/overview');
    state.overview = overview;
    const envs = overview.environments.map((e) => e.env);
    if (!state.env || !envs.includes(state.env)) {
      const chosen = envs[0] || null;
      if (chosen !== state.env) {
        state.env = chosen;
        writeLocation(false);
      }
    }
    renderEnvs();
    renderOverview();
  }

  function currentEnv() {
    return (state.overview?.environments || []).find((e) => e.env === state.env) || null;
  }

  function renderEnvs() {
    const nav = $('envs');
    nav.replaceChildren(
      ...state.overview.environments.map((e) => {
        const newest = e.deployments[0];
        let health = '';
        if (e.held.length) health = 'held';
        else if (newest && newest.status === 'running') health = 'running';
        else if ((e.resources.failed || 0) > 0 || (newest && newest.status === 'failed')) health = 'failed';
        else if (e.pin) health = 'pinned';
        else if (e.drift) health = 'drifted';
        const button = el(
          'button',
          {
            type: 'button',
            role: 'tab',
            'data-env': e.env,
            'aria-selected': e.env === state.env ? 'true' : 'false',
            title: health ? `${e.env}: ${health}` : e.env,
          },
          e.env,
          el('span', { class: `dot ${health}` }),
        );
        button.addEventListener('click', () => chooseEnv(e.env));
        return button;
      }),
    );
  }

  function chooseEnv(env) {
    if (env === state.env) return;
    state.env = env;
    state.filters = { app: '', type: '', q: '' };
    $('filter-q').value = '';
    closeDetails(null);
    writeLocation(true);
    renderEnvs();
    renderOverview();
    loadGraph().catch((e) => problem(e.message));
  }

  function renderOverview() {
    const env = currentEnv();
    const summary = $('summary');
    if (!env) {
      summary.replaceChildren(el('p', { class: 'quiet', text: 'No environment has been deployed yet.' }));
      $('deployments').tBodies[0].replaceChildren();
      $('held-section').hidden = true;
      $('failures-section').hidden = true;
      $('banners').replaceChildren();
      return;
    }
    const r = env.resources;
    const total = Object.values(r).reduce((a, b) => a + b, 0);
    summary.replaceChildren(
      chip('total', 'resources', total),
      chip('ready', 'ready', r.ready || 0),
      chip('failed', 'failed', r.failed || 0),
      chip('orphaned', 'orphaned', r.orphaned || 0),
    );
    renderBanners(env);
    renderHeld(env);
    renderFailures(env);
    renderDeployments(env);
  }

  // What the CLI's `status` says of an environment beyond its resources: pin, drift found,
  // preview, and a running deployment's progress.
  function renderBanners(env) {
    const out = [];
    if (env.progress) {
      const p = env.progress;
      const flying = p.in_flight.slice(0, 8);
      out.push(el('div', { class: 'banner running', 'data-banner': 'progress' },
        el('b', { text: 'Deploying' }), ' ',
        el('span', { class: 'progress-count', text: `${p.done} of ${p.total} done` }),
        el('progress', { max: Math.max(p.total, 1), value: p.done }),
        flying.length
          ? el('p', { class: 'quiet' }, 'In flight: ', ...flying.map((l, i) => el('span', { class: 'mono', text: (i ? ', ' : '') + l })),
            p.in_flight.length > flying.length ? ` and ${p.in_flight.length - flying.length} more` : '')
          : null));
    }
    if (env.pin) {
      const p = env.pin;
      out.push(el('div', { class: 'banner pinned', 'data-banner': 'pin' },
        el('p', {}, el('b', { text: 'Pinned' }), ' at ', el('span', { class: 'mono', title: p.commit, text: short(p.commit) }),
          ` by ${p.by} since ${when(p.since)}${p.forced ? ' (forced)' : ''}: `, el('span', { class: 'reason', text: p.reason })),
        p.waiting_commit
          ? el('p', { 'data-waiting': p.waiting_commit }, 'Held back: ', el('span', { class: 'mono', title: p.waiting_commit, text: short(p.waiting_commit) }),
            p.waiting_summary ? ` “${p.waiting_summary}”` : '', p.waiting_author ? ` by ${p.waiting_author}` : '', ' is planned, not applied.')
          : el('p', { class: 'quiet', text: 'No newer commit held back yet.' }),
        el('p', { class: 'quiet' }, 'Release with ', el('code', { text: `gitplane unpin --env ${env.env}` }))));
    }
    if (env.drift) {
      const d = env.drift;
      const byResource = new Map();
      for (const f of d.findings) {
        if (!byResource.has(f.guresid)) byResource.set(f.guresid, { f, what: [] });
        byResource.get(f.guresid).what.push(f);
      }
      out.push(el('div', { class: 'banner drifted', 'data-banner': 'drift' },
        el('p', {}, el('b', { text: 'Drift found' }), ` by the detect run of ${when(d.finished_at)}: ${d.resources} resource(s) differ from what was recorded.`),
        el('ul', {}, ...[...byResource.values()].map(({ f, what }) => {
          const li = el('li', { 'data-guresid': f.guresid },
            el('a', { href: '#', text: label(f) }), f.app ? el('span', { class: 'quiet', text: ` · ${f.app}` }) : null,
            ...what.map((w) => el('div', { class: 'finding' }, el('span', { class: 'what', text: `${w.what}: ` }), longText(w.detail, 'detail'))));
          li.querySelector('a').addEventListener('click', (ev) => {
            ev.preventDefault();
            select(f.guresid);
          });
          return li;
        })),
        d.findings_total > d.findings.length ? el('p', { class: 'quiet', text: `${d.findings.length} of ${d.findings_total} findings shown.` }) : null));
    }
    if (env.preview) {
      const p = env.preview;
      out.push(el('div', { class: 'banner preview', 'data-banner': 'preview' },
        el('p', {}, el('b', { text: 'Preview' }), ' of branch ', el('span', { class: 'mono', text: p.branch }),
          p.commit ? el('span', {}, ' at ', el('span', { class: 'mono', title: p.commit, text: short(p.commit) })) : null,
          p.expires_at ? ` · expires ${when(p.expires_at)} (last push ${when(p.pushed_at)})` : ' · kept until the branch is deleted'),
        p.refused_commit ? el('p', { class: 'error' }, `Head ${short(p.refused_commit)} not deployed: `, longText(p.refused_why, 'why')) : null));
    }
    $('banners').replaceChildren(...out);
  }

  function chip(kind, name, n) {
    return el('div', { class: `chip ${kind}`, 'data-count': kind }, el('b', { text: n }), name);
  }

  function renderHeld(env) {
    $('held-section').hidden = env.held.length === 0;
    $('held').replaceChildren(
      ...env.held.map((d) =>
        el(
          'div',
          { class: 'held-card', 'data-held': d.id },
          el(
            'p',
            {},
            el('b', { text: `Deployment ${d.id}` }),
            ` of ${short(d.commit)}`,
            d.summary ? ` “${d.summary}”` : '',
            ` would delete ${(d.would_delete || []).length} resource(s).`,
          ),
          d.error ? el('p', {}, longText(d.error, 'why')) : null,
          el('ul', {}, ...(d.would_delete || []).map((g) => el('li', { class: 'mono', text: g }))),
          el('p', { class: 'quiet' }, 'Approve with ', el('code', { text: `gitplane approve ${d.id}` })),
        ),
      ),
    );
  }

  function renderFailures(env) {
    $('failures-section').hidden = env.failed_total === 0;
    $('failures-total').textContent = env.failed_total > env.failed.length
      ? `(${env.failed.length} of ${env.failed_total})`
      : `(${env.failed_total})`;
    $('failures').replaceChildren(
      ...env.failed.map((f) => {
        const li = el(
          'li',
          { 'data-guresid': f.guresid, title: f.guresid },
          el('b', { text: label(f) }),
          f.app ? el('span', { class: 'quiet', text: ` · ${f.app}` }) : null,
          longText(f.error || 'failed', 'msg'),
        );
        li.addEventListener('click', () => select(f.guresid));
        return li;
      }),
    );
  }

  function renderDeployments(env) {
    // Rows that were not there at the last refresh light up; an environment's first showing
    // lights none.
    const first = !state.seen.has(env.env);
    state.seen.add(env.env);
    const rows = env.deployments.map((d) => {
      const fresh = !first && !state.seen.has(`${env.env}/${d.id}`);
      state.seen.add(`${env.env}/${d.id}`);
      const message = el(
        'td',
        { class: 'message', title: d.summary || '' },
        d.kind === 'drift' ? el('span', { class: 'status', text: 'drift' }) : null,
        d.kind === 'drift' ? ' ' : null,
        d.summary || (d.commit ? '' : 'the revision could not be read'),
        el('span', { class: 'author', text: d.author || '' }),
        d.status === 'failed' && d.error ? longText(d.error, 'why') : null,
      );
      return el(
        'tr',
        {
          'data-deployment': d.id,
          'data-status': d.status,
          'data-commit': d.commit || '',
          class: fresh ? 'fresh' : null,
        },
        el('td', { text: d.id }),
        el('td', { class: 'mono', title: d.commit || '', text: short(d.commit) }),
        message,
        el('td', {}, el('span', { class: `status ${d.status}`, text: d.status })),
        el('td', { title: d.started_at }, when(d.started_at), el('span', { class: 'took', text: took(d.started_at, d.finished_at) })),
        el('td', {
          text: d.calls,
          title: `created ${d.created}, updated ${d.updated}, deleted ${d.deleted}, unchanged ${d.unchanged}, failed ${d.failed}`,
        }),
      );
    });
    $('deployments').tBodies[0].replaceChildren(...rows);
    $('no-deployments').hidden = rows.length > 0;
  }

  // ---------------------------------------------------------------------------------------
  // The graph.

  function graphQuery() {
    const p = new URLSearchParams();
    for (const k of ['app', 'type', 'q']) if (state.filters[k]) p.set(k, state.filters[k]);
    if (state.mode === 'list') p.set('view', 'list');
    return p.toString();
  }

  // The census's filters: the apps listed are those of the type and search, whatever app.
  function censusQuery() {
    const p = new URLSearchParams();
    for (const k of ['type', 'q']) if (state.filters[k]) p.set(k, state.filters[k]);
    return p.toString();
  }

  // The graph asked for, with the census of the environment it is drawn in: an answer without
  // an app carries it; one app's answer does not, so the census is asked apart (at the same
  // time), and kept for the next apps chosen until the next refresh or another type or search.
  async function loadGraph() {
    if (!state.env) {
      $('graph').replaceChildren();
      return;
    }
    const key = `${state.env}?${graphQuery()}`;
    const censusKey = `${state.env}?${censusQuery()}`;
    const tick = state.refreshTick;
    const cached = state.census && state.census.key === censusKey && state.census.tick === tick
      ? state.census.value
      : null;
    const env = encodeURIComponent(state.env);
    const [g, counted] = await Promise.all([
      api(`/api/envs/${env}/graph?${graphQuery()}`),
      state.filters.app && !cached ? api(`/api/envs/${env}/apps?${censusQuery()}`) : null,
    ]);
    if (key !== `${state.env}?${graphQuery()}`) return; // the view moved on meanwhile
    const census = g.apps ? { total: g.total, apps: g.apps, types: g.types } : counted || cached;
    if (census !== cached) state.census = { key: censusKey, tick, value: census };
    Object.assign(g, census);
    const changed = new Set();
    for (const n of g.nodes) {
      if (state.statuses.has(n.guresid) && state.statuses.get(n.guresid) !== n.status) changed.add(n.guresid);
      state.statuses.set(n.guresid, n.status);
    }
    state.graph = g;
    renderFilters(g);
    renderApps(g);
    const refit = key !== state.graphKey;
    state.graphKey = key;
    if (state.mode === 'list') renderList(g);
    else renderGraph(g, refit);
    if (state.selected && changed.has(state.selected)) openDetails(state.selected);
  }

  function renderFilters(g) {
    const apps = $('filter-app');
    apps.replaceChildren(
      el('option', { value: '' }, 'all apps'),
      ...g.apps.map((a) =>
        el('option', { value: a.name === null ? GLOBAL_APP : a.name }, `${a.name === null ? '(no app)' : a.name} (${a.count})`),
      ),
    );
    if (state.filters.app && ![...apps.options].some((o) => o.value === state.filters.app)) {
      apps.append(el('option', { value: state.filters.app }, state.filters.app));
    }
    apps.value = state.filters.app;
    const types = $('filter-type');
    types.replaceChildren(
      el('option', { value: '' }, 'all types'),
      ...g.types.map((t) => el('option', { value: t.name }, `${t.name} (${t.count})`)),
    );
    if (state.filters.type && ![...types.options].some((o) => o.value === state.filters.type)) {
      types.append(el('option', { value: state.filters.type }, state.filters.type));
    }
    types.value = state.filters.type;
    if (document.activeElement !== $('filter-q')) $('filter-q').value = state.filters.q;
  }

  function setFilter(name, value) {
    if (state.filters[name] === value) return;
    state.filters[name] = value;
    writeLocation(true);
    loadGraph().catch((e) => problem(e.message));
  }

  function setMode(mode) {
    if (state.mode === mode) return;
    state.mode = mode;
    writeLocation(true);
    renderMode();
    loadGraph().catch((e) => problem(e.message));
  }

  function renderMode() {
    const list = state.mode === 'list';
    $('mode-graph').setAttribute('aria-pressed', list ? 'false' : 'true');
    $('mode-list').setAttribute('aria-pressed', list ? 'true' : 'false');
    $('graph-box').hidden = list;
    $('list-box').hidden = !list;
    $('fit').hidden = list;
    $('legend').hidden = list;
  }

  // The apps of the environment, worst first (failed, blocked, orphaned, in progress, ready),
  // each with a colour and a word: a click shows that app.
  function appButtons(g) {
    const apps = [...g.apps].sort((a, b) => rank(a.status) - rank(b.status) || (b.failed || 0) - (a.failed || 0)
      || String(a.name).localeCompare(String(b.name)));
    return apps.map((a) => {
      const value = a.name === null ? GLOBAL_APP : a.name;
      const b = el('button', {
        type: 'button',
        class: `app-status ${a.status}${value === state.filters.app ? ' chosen' : ''}`,
        'data-app': value,
        'data-status': a.status,
        title: `${a.count} resource(s)${a.failed ? `, ${a.failed} failed or blocked` : ''}`,
      },
      el('span', { class: 'name', text: a.name === null ? '(no app)' : a.name }),
      el('span', { class: `status ${a.status}`, text: statusWord(a.status) }),
      el('span', { class: 'quiet', text: ` ${a.count}` }));
      b.addEventListener('click', () => setFilter('app', value === state.filters.app ? '' : value));
      return b;
    });
  }

  function renderApps(g) {
    const shown = g.apps.length > 1 || (g.apps.length === 1 && g.apps[0].status !== 'ready');
    $('apps-section').hidden = !shown;
    const bad = g.apps.filter((a) => a.status !== 'ready').length;
    $('apps-total').textContent = `(${g.apps.length}${bad ? `, ${bad} not ready` : ''})`;
    $('apps').replaceChildren(...appButtons(g));
  }

  const COLUMNS = [
    ['app', 'App', (n) => n.app || ''],
    ['type', 'Type', (n) => n.type],
    ['res_id', 'Resource', (n) => n.res_id],
    ['status', 'Status', (n) => rank(n.status)],
  ];

  // The matching resources as a table, sorted by a column (a click on its head; again for
  // the reverse order).
  function renderList(g) {
    const info = $('graph-info');
    const table = $('list');
    $('too-large').hidden = true;
    if (g.too_large) {
      info.textContent = `${g.matched} of ${g.total} resources`;
      table.tBodies[0].replaceChildren();
      $('list-note').textContent = `${g.matched} resources match: more than the list shows. Choose an app, or narrow by type or search.`;
      $('list-note').hidden = false;
      return;
    }
    info.textContent = g.matched === g.total ? `${g.total} resources` : `${g.matched} of ${g.total} resources`;
    const [, , keyOf] = COLUMNS.find(([k]) => k === state.sort.key) || COLUMNS[3];
    const byName = (n) => `${n.app || ''}\u0000${n.type}\u0000${n.res_id}`;
    const nodes = [...g.nodes].sort((a, b) => {
      const ka = keyOf(a);
      const kb = keyOf(b);
      const c = typeof ka === 'number' ? ka - kb : String(ka).localeCompare(String(kb));
      return (state.sort.desc ? -c : c) || byName(a).localeCompare(byName(b));
    });
    for (const th of table.tHead.rows[0].cells) {
      const sorted = th.dataset.sort === state.sort.key;
      th.setAttribute('aria-sort', sorted ? (state.sort.desc ? 'descending' : 'ascending') : 'none');
    }
    const rows = nodes.slice(0, LIST_ROWS).map((n) => {
      const tr = el('tr', { 'data-guresid': n.guresid, 'data-status': n.status, class: n.ghost ? 'ghost' : null },
        el('td', { text: n.app || '(no app)' }),
        el('td', { text: n.type + (n.class !== 'default' ? '.' + n.class : '') }),
        el('td', { class: 'mono', title: n.guresid, text: n.res_id }),
        el('td', {}, el('span', { class: `status ${n.status}`, text: statusWord(n.status) }), n.reason ? longText(n.reason, 'why') : null));
      tr.addEventListener('click', () => select(n.guresid));
      return tr;
    });
    table.tBodies[0].replaceChildren(...rows);
    $('list-note').hidden = nodes.length <= LIST_ROWS;
    $('list-note').textContent = `The first ${LIST_ROWS} of ${nodes.length} are listed: narrow with the filters.`;
  }

  function setSort(key) {
    state.sort = state.sort.key === key ? { key, desc: !state.sort.desc } : { key, desc: false };
    writeLocation(true);
    if (state.graph) renderList(state.graph);
  }

  function renderGraph(g, refit) {
    const root = $('graph');
    const info = $('graph-info');
    $('too-large').hidden = !g.too_large;
    $('graph-empty').hidden = g.too_large || g.nodes.length > 0;
    if (g.too_large) {
      root.replaceChildren();
      info.textContent = `${g.matched} of ${g.total} resources`;
      $('too-large-text').textContent = `${g.matched} resources match: more than ${g.limit} are not drawn at once. Choose an app, or narrow by type or search.`;
      $('too-large-apps').replaceChildren(...appButtons(g));
      return;
    }
    info.textContent = g.matched === g.total
      ? `${g.total} resources`
      : `${g.matched} of ${g.total} resources`;

    const w = g.node_width;
    const h = g.node_height;
    const at = new Map(g.nodes.map((n) => [n.guresid, n]));
    const defs = svg('defs', {}, ...EDGE_KINDS.map(([kind]) =>
      svg('marker', {
        id: `arrow-${kind}`, class: kind, viewBox: '0 0 10 10', refX: '9', refY: '5',
        markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse',
      }, svg('path', { d: 'M 0 0 L 10 5 L 0 10 z' }))));
    const edges = svg('g', { class: 'edges' }, ...g.edges.map((e) => {
      const c = at.get(e.consumer);
      const p = at.get(e.provider);
      const kind = EDGE_KINDS.some(([k]) => k === e.kind) ? e.kind : 'dependency';
      return svg('path', {
        class: `edge ${kind}`,
        d: edgePath(c, p, e.points || [], w),
        'marker-end': `url(#arrow-${kind})`,
        'data-consumer': e.consumer,
        'data-provider': e.provider,
        'data-kind': kind,
      }, svg('title', { text: `${e.kind} (${e.update_type})` }));
    }));
    const nodes = svg('g', { class: 'nodes' }, ...g.nodes.map((n) => {
      const node = svg('g', {
        class: `node ${n.status}${n.ghost ? ' ghost' : ''}${n.guresid === state.selected ? ' selected' : ''}`,
        transform: `translate(${n.x - w / 2} ${n.y - h / 2})`,
        'data-guresid': n.guresid,
        'data-type': n.type,
        'data-app': n.app === null ? GLOBAL_APP : n.app,
        'data-status': n.status,
        'data-ghost': n.ghost ? 'true' : null,
        'data-reason': n.reason || null,
        tabindex: '0',
      },
      svg('title', { text: `${label(n)}\n${n.app ? 'app ' + n.app + ' · ' : ''}${statusWord(n.status)}${n.ghost ? ' (not recorded)' : ''}\n${n.reason ? n.reason + '\n' : ''}${n.guresid}` }),
      svg('rect', { width: w, height: h, rx: 6 }),
      svg('text', { class: 'kind', x: 9, y: 14, text: elide(n.type + (n.class !== 'default' ? '.' + n.class : '') + (n.app ? ` · ${n.app}` : ''), 30) }),
      svg('text', { class: 'name', x: 9, y: 29, text: elide(n.res_id, 26) }),
      n.hidden_links ? svg('text', { class: 'hidden-links', x: w - 6, y: 14, 'text-anchor': 'end', text: `+${n.hidden_links}` }) : null,
      n.ghost ? svg('text', { class: 'reason', x: 0, y: h + 12, text: clip(`${statusWord(n.status)}: ${n.reason || 'not made'}`, 34) }) : null);
      node.addEventListener('click', () => select(n.guresid));
      node.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') select(n.guresid); });
      return node;
    }));
    const viewport = svg('g', { id: 'viewport' }, edges, nodes);
    root.replaceChildren(defs, viewport);
    root.dataset.width = g.width;
    root.dataset.height = g.height;
    if (refit || !state.view.moved) fit();
    else applyView();
    lightEdges();
  }

  // From the consumer's left side to the provider's right side, through each waypoint's slot
  // (straight across it), curving between layers.
  function edgePath(c, p, points, w) {
    let x = c.x - w / 2;
    let y = c.y;
    let d = `M ${x} ${y}`;
    const curveTo = (tx, ty) => {
      const bend = Math.max(30, Math.abs(x - tx) / 2);
      const dir = tx <= x ? -1 : 1;
      d += ` C ${x + dir * bend} ${y}, ${tx - dir * bend} ${ty}, ${tx} ${ty}`;
      x = tx;
      y = ty;
    };
    for (const [px, py] of points) {
      curveTo(px + w / 2, py);
      d += ` L ${px - w / 2} ${py}`;
      x = px - w / 2;
    }
    curveTo(p.x + w / 2, p.y);
    return d;
  }

  function applyView() {
    const v = state.view;
    const viewport = $('viewport');
    if (viewport) viewport.setAttribute('transform', `translate(${v.x} ${v.y}) scale(${v.k})`);
  }

  function fit() {
    const g = state.graph;
    const box = $('graph-box').getBoundingClientRect();
    if (!g || g.too_large || !g.nodes.length || box.width === 0) return;
    const margin = 30;
    const k = Math.min(1.25, (box.width - 2 * margin) / g.width, (box.height - 2 * margin) / g.height);
    state.view = {
      k,
      x: (box.width - g.width * k) / 2,
      y: (box.height - g.height * k) / 2,
      moved: false,
    };
    applyView();
  }

  function lightEdges() {
    for (const e of document.querySelectorAll('#graph .edge')) {
      const lit = state.selected && (e.dataset.consumer === state.selected || e.dataset.provider === state.selected);
      e.classList.toggle('lit', Boolean(lit));
    }
  }

  function setUpPanZoom() {
    const root = $('graph');
    let drag = null;
    root.addEventListener('pointerdown', (ev) => {
      if (ev.button !== 0 || ev.target.closest('.node')) return;
      drag = { x: ev.clientX, y: ev.clientY, vx: state.view.x, vy: state.view.y };
      root.setPointerCapture(ev.pointerId);
      root.classList.add('panning');
    });
    root.addEventListener('pointermove', (ev) => {
      if (!drag) return;
      state.view.x = drag.vx + ev.clientX - drag.x;
      state.view.y = drag.vy + ev.clientY - drag.y;
      state.view.moved = true;
      applyView();
    });
    const end = () => {
      drag = null;
      root.classList.remove('panning');
    };
    root.addEventListener('pointerup', end);
    root.addEventListener('pointercancel', end);
    root.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      const box = root.getBoundingClientRect();
      const px = ev.clientX - box.left;
      const py = ev.clientY - box.top;
      const v = state.view;
      const k = Math.min(4, Math.max(0.02, v.k * Math.exp(-ev.deltaY * 0.0015)));
      v.x = px - ((px - v.x) * k) / v.k;
      v.y = py - ((py - v.y) * k) / v.k;
      v.k = k;
      v.moved = true;
      applyView();
    }, { passive: false });
  }

  function renderLegend() {
    $('legend').title = 'Boxes are resources, coloured by status; arrows point from a resource to what it depends on, coloured by kind.';
    $('legend').replaceChildren(
      ...STATUSES.map(([s, name]) => el('span', { class: 'key' }, el('span', { class: `box ${s}` }), name)),
      el('span', { class: 'sep' }),
      ...EDGE_KINDS.map(([k, name]) => el('span', { class: 'key' }, el('span', { class: `line ${k}` }), name)),
    );
  }

  // ---------------------------------------------------------------------------------------
  // One resource: its record, outputs (secret ones by name only), links, bindings, explain.

  function select(guresid, push = true) {
    state.selected = guresid;
    writeLocation(push);
    for (const n of document.querySelectorAll('#graph .node')) {
      n.classList.toggle('selected', n.dataset.guresid === guresid);
    }
    lightEdges();
    openDetails(guresid);
  }

  let detailsAsked = 0;

  async function openDetails(guresid) {
    const asked = ++detailsAsked;
    const panel = $('details');
    const wasHidden = panel.hidden;
    panel.hidden = false;
    panel.dataset.guresid = guresid;
    document.body.classList.add('with-details');
    if (wasHidden && !state.view.moved) fit();
    if (panel.dataset.loaded !== guresid) {
      $('details-body').replaceChildren(el('p', { class: 'quiet', text: 'Loading…' }));
    }
    const ghost = (state.graph?.nodes || []).find((n) => n.guresid === guresid && n.ghost);
    if (ghost) {
      $('details-body').replaceChildren(...ghostDetails(ghost));
      panel.dataset.loaded = guresid;
      return;
    }
    try {
      // The record first; explain (which builds the whole environment) after it.
      const path = `/api/envs/${encodeURIComponent(state.env)}/resources/${encodeURIComponent(guresid)}`;
      const r = await api(`${path}?explain=false`);
      if (asked !== detailsAsked) return;
      $('details-body').replaceChildren(...details(r));
      panel.dataset.loaded = guresid;
      const e = await api(`${path}/explain`).catch((err) => ({ explain: null, explain_error: err.message }));
      if (asked !== detailsAsked || !$('details-explain-wait')) return;
      $('details-explain-wait').replaceWith(explainPart(e));
    } catch (e) {
      if (asked !== detailsAsked) return;
      $('details-body').replaceChildren(el('p', { class: 'error', text: e.message }));
      panel.dataset.loaded = '';
    }
  }

  // `push`: the closing is a step of its own in the history; `null`: the caller writes the
  // address (it changes more than this).
  function closeDetails(push = true) {
    detailsAsked++;
    const was = state.selected;
    state.selected = null;
    if (was && push !== null) writeLocation(push);
    $('details').hidden = true;
    $('details').dataset.loaded = '';
    document.body.classList.remove('with-details');
    for (const n of document.querySelectorAll('#graph .node.selected')) n.classList.remove('selected');
    lightEdges();
    if (!state.view.moved) fit();
  }

  // A resource the graph wants and state does not record: what it is and why it is missing.
  function ghostDetails(n) {
    return [
      el('p', { class: 'title' }, label(n), ' ', el('span', { class: `status ${n.status}`, text: statusWord(n.status) })),
      el('p', { class: 'sub mono', text: `${n.guresid} · ${n.app ? 'app ' + n.app : 'no app'} · ${state.env}` }),
      el('p', { class: 'quiet', text: 'Not recorded: the newest deployment wanted it and did not make it.' }),
      el('p', { class: 'error', 'data-error': '', text: n.reason || 'no reason recorded' }),
    ];
  }

  function json(value) {
    return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
  }

  function table(rows) {
    return el('table', {}, el('tbody', {}, ...rows));
  }

  function row(name, value, attrs) {
    return el('tr', attrs || {}, el('th', { text: name }), value instanceof Node ? el('td', {}, value) : el('td', { class: 'value', text: value }));
  }

  function resourceLink(l) {
    const a = el('a', { 'data-guresid': l.guresid, title: l.guresid, href: '#' }, l.type ? label({ type: l.type, class: 'default', res_id: l.res_id }) : l.guresid);
    a.addEventListener('click', (ev) => {
      ev.preventDefault();
      select(l.guresid);
    });
    return a;
  }

  function details(r) {
    const out = [
      el('p', { class: 'title' }, label(r), ' ', el('span', { class: `status ${r.orphan_since ? 'orphaned' : r.status}`, text: r.orphan_since ? 'orphaned' : r.status })),
      el('p', { class: 'sub mono', text: `${r.guresid} · ${r.app ? 'app ' + r.app : 'no app'} · ${r.env}` }),
    ];
    if (r.error) out.push(el('p', { class: 'error', 'data-error': '', text: r.error }));
    if (r.orphan_since) out.push(el('p', { class: 'quiet', text: `Out of the graph since ${when(r.orphan_since)}: ${r.orphan_reason || ''}` }));

    out.push(el('h3', { text: 'Outputs' }));
    const outputs = Object.entries(r.outputs || {});
    const secretNames = r.secret_outputs || [];
    if (!outputs.length && !secretNames.length) out.push(el('p', { class: 'quiet', text: 'none' }));
    else {
      out.push(el('div', { id: 'details-outputs' }, table([
        ...outputs.map(([k, v]) => row(k, json(v), { 'data-output': k })),
        ...secretNames.map((k) => row(k, el('span', { class: 'secret', text: 'secret: not shown' }), { 'data-secret-output': k })),
      ])));
    }
    if (r.secret_outputs_error) out.push(el('p', { class: 'quiet', text: `Secret outputs: ${r.secret_outputs_error}` }));

    const values = (r.inputs && r.inputs.values) || {};
    out.push(el('h3', { text: 'Inputs' }));
    const inputRows = Object.entries(values).map(([k, v]) => row(k, json(v)));
    out.push(inputRows.length ? table(inputRows) : el('p', { class: 'quiet', text: 'no values' }));
    if (r.inputs && r.inputs.resource && Object.keys(r.inputs.resource).length) {
      out.push(el('details', {}, el('summary', { text: 'Resource inputs (Score params or workload)' }), el('pre', { text: json(r.inputs.resource) })));
    }

    out.push(el('h3', { text: 'Record' }));
    out.push(table([
      row('definition', r.definition),
      row('driver', r.driver),
      r.account ? row('account', r.account) : null,
      row('deletion policy', r.deletion_policy),
      row('commit', el('span', { class: 'mono', title: r.commit, text: short(r.commit) })),
      row('deployment', String(r.deployment)),
      row('created', when(r.created_at)),
      row('updated', when(r.updated_at)),
    ].filter(Boolean)));

    const provides = r.links.filter((l) => l.role === 'provider');
    const consumers = r.links.filter((l) => l.role === 'consumer');
    out.push(el('h3', { text: `Depends on (${provides.length})` }));
    out.push(provides.length
      ? el('ul', {}, ...provides.map((l) => el('li', {}, resourceLink(l.other), el('span', { class: 'quiet', text: ` · ${l.kind}` }))))
      : el('p', { class: 'quiet', text: 'nothing' }));
    out.push(el('h3', { text: `Used by (${consumers.length})` }));
    out.push(consumers.length
      ? el('ul', {}, ...consumers.map((l) => el('li', {}, resourceLink(l.other), el('span', { class: 'quiet', text: ` · ${l.kind}` }))))
      : el('p', { class: 'quiet', text: 'nothing' }));

    out.push(el('h3', { text: `Bindings (${r.bindings.length})` }));
    if (r.bindings.length) {
      out.push(table(r.bindings.map((b) => el('tr', {},
        el('th', { class: 'mono', text: b.needed_path }),
        el('td', {},
          resourceLink(b.provider),
          el('span', { class: 'mono', text: ` ${b.provided_path}` }),
          el('br'),
          b.secret
            ? el('span', { class: 'secret', text: 'secret: not shown' })
            : el('span', { class: 'mono', text: json(b.value) }))))));
    } else out.push(el('p', { class: 'quiet', text: 'none' }));

    out.push(el('h3', { text: 'Explain' }));
    out.push(r.explain === null && r.explain_error === null
      ? el('p', { id: 'details-explain-wait', class: 'quiet', text: 'Running explain…' })
      : explainPart(r));
    return out;
  }

  function explainPart(e) {
    return e.explain !== null
      ? el('pre', { id: 'details-explain', text: e.explain })
      : el('p', { class: 'error', text: e.explain_error || 'not available' });
  }

  // ---------------------------------------------------------------------------------------
  // Live updates.

  function live(mode) {
    const badge = $('live');
    badge.dataset.state = mode;
    badge.textContent = mode === 'live' ? 'live' : mode === 'polling' ? 'polling every 10 s' : 'connecting';
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function stream() {
    for (;;) {
      try {
        const response = await fetch('/api/events', {
          credentials: 'same-origin',
          headers: { Accept: 'text/event-stream' },
          cache: 'no-store',
        });
        if (response.status === 401) {
          location.href = '/login';
          return;
        }
        if (!response.ok || !response.body) throw new Error(`events: ${response.status}`);
        live('live');
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            // Keep-alive comments carry no data.
            if (block.split('\n').some((line) => line.startsWith('data:'))) scheduleRefresh();
          }
          if (buffer.length > 65536) buffer = '';
        }
      } catch (e) {
        // The daemon restarted or the network dropped: polling covers it until it is back.
      }
      live('polling');
      await sleep(RECONNECT_MS);
    }
  }

  // ---------------------------------------------------------------------------------------

  function start() {
    readLocation();
    renderLegend();
    setUpPanZoom();
    $('fit').addEventListener('click', fit);
    $('details-close').addEventListener('click', closeDetails);
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && !$('details').hidden) closeDetails();
    });
    $('mode-graph').addEventListener('click', () => setMode('graph'));
    $('mode-list').addEventListener('click', () => setMode('list'));
    for (const th of $('list').tHead.rows[0].cells) th.addEventListener('click', () => setSort(th.dataset.sort));
    window.addEventListener('popstate', followLocation);
    renderMode();
    $('filter-app').addEventListener('change', (ev) => setFilter('app', ev.target.value));
    $('filter-type').addEventListener('change', (ev) => setFilter('type', ev.target.value));
    let searchTimer = null;
    $('filter-q').addEventListener('input', (ev) => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => setFilter('q', ev.target.value.trim()), SEARCH_DELAY_MS);
    });
    window.addEventListener('resize', () => {
      if (!state.view.moved) fit();
    });
    refresh();
    stream();
    setInterval(scheduleRefresh, POLL_MS);
  }

  start();
})();
