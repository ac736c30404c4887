"""Where autotune meets the libraries people train with: Lightning's DataModule (``_lightning``) and the
Hugging Face Trainer's arguments (``_trainer``). Each imports its library lazily, if at all."""
