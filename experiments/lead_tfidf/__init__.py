"""The lead_tfidf study (README.md beside this file)."""
