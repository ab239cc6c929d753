"""The local inspector: `make local`'s view of the saga in a browser, at http://127.0.0.1:<PORT>/_local/.

Served by the local API gateway (gateway/server.py routes /_local/ here; never part of the deployed API):
a static page (static/: HTML, JS and CSS, no build step, nothing from a CDN) over a JSON API (api.py).
What it shows comes from what the stack already records: its activity log (timeline.py builds each
order's hops from it), the order store, and the queues through the moto endpoint (stack_view.py); the
redrive buttons run the operator commands themselves (actions.py: `python -m operations`).
"""
