"""The data: reading the CS224N files, preparing the splits, encoding text to token ids (cached),
each task's view of its rows (single sentence, a pair read jointly or as two sentences), and the
demo data. Imports minbert.core and minbert.params."""
