"""`shardstream view`: the terminal visualizer (textual).

    tui_app.py          the app; the datasets and versions screens
    step_screen.py  the step browser and its prompts
    panes.py        one received row drawn in the terminal, by modality (half-block images, sparklines)
"""
