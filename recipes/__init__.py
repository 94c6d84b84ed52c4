"""Recipe data files (YAML), shipped as quantize_cli.recipes; loaded by quantize_cli.recipes_loader."""
