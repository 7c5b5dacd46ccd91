"""`shardstream web`: the browser visualizer, a Starlette app rendered on the server.

    web_app.py        the app: routes, the state it shares (DataSource, Catalog), errors as pages
    links.py      URLs with the state in them (every page is a link that can be shared)
    pages.py      datasets, versions, a version, a diff, jobs, a job, the fleet
    step_page.py  the step browser, the mixture view and the shuffle-quality page
    dense.py      a step's layout (thumbnail grid, table, cards) and its per-step counts
    media.py      images, frame strips, WAV and waveforms of one sample, with caching headers
    templates/    Jinja2 templates; static/ the one stylesheet

No JavaScript: pages are HTML and CSS, plots are SVG and PNG made on the server, so nothing is
fetched from elsewhere at run time.
"""
