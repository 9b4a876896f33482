"""Model construction and loading: local Hugging Face directories, tiny test models."""
