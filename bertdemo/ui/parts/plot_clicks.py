"""A click on a point of a plotly chart that opens what the point stands for: the point's first
customdata is written into a box and a button is pressed, as if the visitor had typed it and
clicked (Gradio's plot sends no click events of its own).

    drawn.then(None, None, None, js=plot_clicks.opener("features-map", "features-feature", "features-open-card"))

The listener is attached to the chart inside the element `plot_id` and again whenever plotly draws
it anew (checked every 300 ms); installed once per page and element.
"""
from __future__ import annotations

import json


def opener(plot_id: str, box_id: str, button_id: str) -> str:
    """The JavaScript (a Gradio event's `js`) that makes a click on a point of the chart in
    `#plot_id` write its customdata into the input of `#box_id` and press `#button_id`."""
    plot, box, button = (json.dumps(f"{name}") for name in (plot_id, box_id, button_id))
    return f"""() => {{
    const flag = "__clicks_" + {plot};
    if (window[flag]) return;
    window[flag] = true;
    const pick = (value) => {{
        const input = document.querySelector("#" + {box} + " textarea, #" + {box} + " input");
        if (!input) return;
        input.value = value;
        input.dispatchEvent(new Event("input", {{bubbles: true}}));
        setTimeout(() => {{ const open = document.getElementById({button}); if (open) open.click(); }}, 60);
    }};
    setInterval(() => {{
        document.querySelectorAll("#" + {plot} + " .js-plotly-plot").forEach((chart) => {{
            if (!chart.on || !chart._fullLayout || chart.__clickLayout === chart._fullLayout) return;
            chart.__clickLayout = chart._fullLayout;
            if (chart.removeAllListeners) chart.removeAllListeners("plotly_click");
            chart.on("plotly_click", (event) => {{
                const point = event && event.points && event.points[0];
                const data = point && point.customdata;
                if (data !== undefined && data !== null) pick(String(Array.isArray(data) ? data[0] : data));
            }});
        }});
    }}, 300);
}}"""
