"""What serves the page: launch, signals and shut-down, /healthz, the queue watch, MCP tools, the sent values; imports the service only, no tab or part."""
