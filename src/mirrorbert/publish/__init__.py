"""What a saved model shows and where it goes: its model card (`model_card`) and the Hugging Face Hub upload (`hub`),
both from a saved folder, never from a live model."""
