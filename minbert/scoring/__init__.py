"""Scoring: a trained model's predictions on the dev and test splits, a predictions folder's
metrics against the labels, bootstrap intervals and paired differences, and ensembles of
prediction folders. Imports the layers below (predictions load a model from minbert.train)."""
