"""What a request shows of a model: fill mask, attention, heads, explain, embeddings, masking, search; imports model/, forward/."""
