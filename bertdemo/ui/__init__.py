"""The Gradio page in three rooms: tabs/ (one module per tab), parts/ (what the tabs share), serving/ (what serves the page). Only this package (and app.py) imports gradio."""
