"""The engine everyone shares (models loaded once, caches, memos), the micro-batcher, and the one thread their forwards run on; imports views/ and below."""
