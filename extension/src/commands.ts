/**
 * The command IDs of the Pathways sidebar, and the commands themselves.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { PATHWAYS_CELL, PathwaysPanel } from './panel';

export namespace CommandIDs {
  export const insertCell = 'pwkernel:insert-pathways-cell';
  export const showSchedule = 'pwkernel:show-schedule';
  export const exportTrace = 'pwkernel:export-trace';
  export const openSidebar = 'pwkernel:open-sidebar';
}

export const PALETTE_CATEGORY = 'Pathways';

export function addCommands(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  panel: PathwaysPanel,
  palette: ICommandPalette | null
): void {
  const hasNotebook = () => tracker.currentWidget !== null;

  app.commands.addCommand(CommandIDs.insertCell, {
    label: 'Pathways: Insert %%pathways cell',
    caption: 'Insert a %%pathways cell below the active cell',
    isEnabled: hasNotebook,
    execute: () => {
      const nb = tracker.currentWidget;
      if (!nb) {
        return;
      }
      NotebookActions.insertBelow(nb.content);
      nb.content.activeCell?.model.sharedModel.setSource(PATHWAYS_CELL);
      nb.content.mode = 'edit';
    }
  });

  app.commands.addCommand(CommandIDs.showSchedule, {
    label: 'Pathways: Show schedule',
    caption: 'Insert and run a cell with the live schedule view of this kernel',
    isEnabled: hasNotebook,
    execute: () => panel.showSchedule()
  });

  app.commands.addCommand(CommandIDs.exportTrace, {
    label: 'Pathways: Export trace',
    caption: "Save the controller's trace (Chrome trace / Perfetto JSON) next to the notebook",
    isEnabled: hasNotebook,
    execute: () => panel.exportTrace()
  });

  app.commands.addCommand(CommandIDs.openSidebar, {
    label: 'Pathways: Open sidebar',
    execute: () => app.shell.activateById(panel.id)
  });

  if (palette) {
    for (const command of Object.values(CommandIDs)) {
      palette.addItem({ command, category: PALETTE_CATEGORY });
    }
  }
}
