"""Pages a person opens: the run's `report.html` (what the server holds), each node's own `report.html`
(that node's records, never sent) and an experiment's `table.html`. One self-contained HTML file each:
styles inline, charts as inline SVG, thumbnails as data URIs, no script and no network access."""
