"""minbert: the library of the multi-task BERT pipeline (encoder, data, training, evaluation, reports)."""
