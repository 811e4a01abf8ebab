"""Pictures in and out: reading and checking image files and bytes, atomic PNG and text writes, 3:4 framing,
mask images, contact sheets and how alike two pictures are (PSNR, SSIM). No models and no torch.

Imports only `ootd.errors`, `ootd.settings` and `preprocess` (mask dilation).
"""
