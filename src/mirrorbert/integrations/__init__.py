"""Mirror-BERT inside other libraries' training loops (optional extras; nothing here is imported by mirrorbert)."""
