"""The data: reading the raw CS224N files (raw.py, the prepare stage's alone), preparing the
splits, the prepared splits every stage reads (read.py), downsampling (downsample.py), encoding text
to token ids (cached), each task's view of its rows (single sentence, a pair read jointly or as two
sentences), and the demo data. Imports minbert.core and minbert.params."""
