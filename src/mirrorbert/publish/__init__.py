"""What a saved model shows and where it goes: its model card (`model_card`) and the Hugging Face Hub upload (`hub`).

Both work on a saved folder, never on a live model, so the encoder's `save` and `push_to_hub` call down into them.
"""
