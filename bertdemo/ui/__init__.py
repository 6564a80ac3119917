"""The Gradio tabs, one module each. Only this package (and app.py) imports gradio."""
