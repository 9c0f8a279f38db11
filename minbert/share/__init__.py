"""Sharing a trained model: the Hugging Face export (and upload) and the leaderboard submission
files. Imports the layers below."""
