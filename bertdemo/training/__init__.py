"""The loop, the MLM fine-tune, the classifier, the experiments, the export and its script template; imports views/ and below."""
