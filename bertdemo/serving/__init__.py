"""The engine everyone shares (models loaded once, caches, memos) and the micro-batcher; imports views/ and below."""
