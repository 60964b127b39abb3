"""What a saved model shows and where it goes: its model card (`model_card`) and the Hugging Face Hub upload (`hub`).

Both work on a saved folder, never on a live model: `Encoder.save` writes the card, and `hub.push_encoder`
writes an encoder into a temporary folder before pushing it.
"""
